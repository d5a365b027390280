// A program linked to libcohort-cuda with no device to use: no driver on
// this machine, or CUDA_VISIBLE_DEVICES=-1 hiding the devices there are
// (meson sets it). It loads, runs, and every entry point says why.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>

#include <cohort/cuda/chunk.hpp>
#include <cohort/cuda/device.hpp>
#include <cohort/cuda/error.hpp>
#include <cohort/cuda/event.hpp>
#include <cohort/cuda/tensor.hpp>
#include <cohort/storage.hpp>
#include <cohort/tensor.hpp>

#include "support/cuda_records.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace cohort;

namespace {

constexpr std::size_t two_mib = std::size_t{2} << 20;

// Checks that `call` throws no_device naming `entry` and the reason.
void check_no_device(const std::string& entry, const std::function<void()>& call) {
  CAPTURE(entry);
  try {
    call();
    FAIL("no exception");
  } catch (const cuda::no_device& e) {
    CHECK(std::string(e.what()) == entry + ": no CUDA device: " + cuda::unavailable_reason());
    CHECK(e.reason() == cuda::unavailable_reason());
    CHECK(e.call() == entry);
  }
}

// Host bytes posing as memory on CUDA device `index`: what a device tensor
// made through the layers' interface holds where no device can make one.
class posing_memory final : public detail::device_memory {
 public:
  explicit posing_memory(int index) : index_(index) {}
  std::byte* data() const noexcept override { return bytes_.get(); }
  std::size_t nbytes() const noexcept override { return 16; }
  int device_type() const noexcept override { return kDLCUDA; }
  int device_index() const noexcept override { return index_; }
  std::size_t handle_bound() const noexcept override { return 0; }
  void write(std::vector<std::byte>&) const override { throw std::logic_error("posing memory is not sent"); }

 private:
  int index_;
  std::unique_ptr<std::byte[]> bytes_ = std::make_unique<std::byte[]>(16);
};

// Four float32 elements "on" CUDA device `index`.
tensor posing_tensor(int index) {
  const std::array<std::int64_t, 1> shape{4}, strides{1};
  return tensor(detail::make_device_storage(std::make_shared<posing_memory>(index)), dtype::float32, shape, strides, 0,
                device{kDLCUDA, index});
}

}  // namespace

TEST_SUITE("cuda without a device") {
  TEST_CASE("CUDA is not available, says why, and counts no device") {
    CHECK_FALSE(cuda::available());
    CHECK(cuda::device_count() == 0);
    // The runtime loaded the driver, if there is one: it then saw no
    // device (or was too old to ask); else there is no driver.
    void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    const std::string reason = cuda::unavailable_reason();
    CAPTURE(reason);
    if (std::getenv("COHORT_TEST_STUB_DRIVER") != nullptr) {
      CHECK(reason == "no driver (the libcuda.so.1 found is the CUDA toolkit's stub, not a driver's)");
    } else if (driver != nullptr) {
      ::dlclose(driver);
      const bool no_device = reason.starts_with("no device (the driver, CUDA ") &&
                             reason.ends_with("sees none; CUDA_VISIBLE_DEVICES=-1)");
      CHECK((no_device || reason.starts_with("driver too old (")));
    } else {
      CHECK(reason == "no driver (libcuda.so.1 could not be loaded)");
    }
  }

  // Before, the stub read as no library at all ("could not be loaded").
  TEST_CASE("the CUDA toolkit's stub driver, found first, is named as the stub") {
    if (std::getenv("COHORT_TEST_STUB_DRIVER") != nullptr) return;  // this program, run below
    const std::filesystem::path stub = "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so";
    if (!std::filesystem::exists(stub)) {
      MESSAGE("no CUDA toolkit stub at ", stub.string(), ": skipped");
      return;
    }
    std::string made = (std::filesystem::temp_directory_path() / "cohort-stub-XXXXXX").string();
    REQUIRE(::mkdtemp(made.data()) != nullptr);
    const std::filesystem::path dir = made;
    std::filesystem::create_symlink(stub, dir / "libcuda.so.1");
    // This program again, finding the stub first: its check above of the
    // reason, and every entry point's no_device.
    const std::string run = "LD_LIBRARY_PATH='" + dir.string() + "' COHORT_TEST_STUB_DRIVER=1 /proc/" +
                            std::to_string(::getpid()) +
                            "/exe -tc='CUDA is not available*,every entry point*' > /dev/null 2>&1";
    const int status = std::system(run.c_str());
    std::filesystem::remove_all(dir);
    CHECK(status == 0);
  }

  // Before, a library that loads read as no library at all.
  TEST_CASE("a libcuda.so.1 found first that is not a driver is named, with what it lacks") {
    if (const char* dir = std::getenv("COHORT_TEST_NOT_A_DRIVER_IN"); dir != nullptr) {  // this program, run below
      CHECK(cuda::unavailable_reason() == std::string("no driver (the libcuda.so.1 found, ") + dir +
                                              "/libcuda.so.1, is not a CUDA driver: it has no cuInit)");
      return;
    }
    // A library with none of the driver's functions (meson names it).
    const char* library = std::getenv("COHORT_TEST_NOT_A_DRIVER");
    if (library == nullptr) {
      MESSAGE("COHORT_TEST_NOT_A_DRIVER is not set: skipped");
      return;
    }
    std::string made = (std::filesystem::temp_directory_path() / "cohort-not-a-driver-XXXXXX").string();
    REQUIRE(::mkdtemp(made.data()) != nullptr);
    const std::filesystem::path dir = made;
    std::filesystem::create_symlink(std::filesystem::absolute(library), dir / "libcuda.so.1");
    // This program again, finding that library first: the reason above,
    // and every entry point's no_device.
    const std::string run = "LD_LIBRARY_PATH='" + dir.string() + "' COHORT_TEST_NOT_A_DRIVER_IN='" + dir.string() +
                            "' /proc/" + std::to_string(::getpid()) +
                            "/exe -tc='a libcuda.so.1 found first*,every entry point*' > /dev/null 2>&1";
    const int status = std::system(run.c_str());
    std::filesystem::remove_all(dir);
    CHECK(status == 0);
  }

  TEST_CASE("every entry point throws no_device, naming itself and the reason") {
    check_no_device("cohort::cuda::device_uuid", [] { cuda::device_uuid(0); });
    check_no_device("cohort::cuda::find_device", [] { cuda::find_device(cuda::uuid{}); });
    check_no_device("cohort::cuda::device_memory", [] { cuda::device_memory(0); });
    check_no_device("cohort::cuda::supports_file_descriptors", [] { cuda::supports_file_descriptors(0); });
    check_no_device("cohort::cuda::preferred_sharing", [] { cuda::preferred_sharing(0); });
    check_no_device("cohort::cuda::granularity", [] { cuda::granularity(0, cuda::sharing::file_descriptor); });
    check_no_device("cohort::cuda::chunk::create", [] { cuda::chunk::create(0, 1); });
    check_no_device("cohort::cuda::chunk::create", [] { cuda::chunk::create(0, 1, cuda::sharing::ipc_handle); });
    check_no_device("cohort::cuda::chunk::import", [] { cuda::chunk::import(0, 0, two_mib); });
    check_no_device("cohort::cuda::chunk::open", [] { cuda::chunk::open(0, cuda::ipc_memory_handle{}, two_mib); });
    check_no_device("cohort::cuda::event", [] { cuda::event e(0); });
    check_no_device("cohort::cuda::event::from_ipc_handle",
                    [] { cuda::event::from_ipc_handle(0, cuda::ipc_event_handle{}); });
    // Device tensors.
    check_no_device("cohort::cuda::empty", [] { cuda::empty({4}, dtype::float32, 0); });
    check_no_device("cohort::cuda::full", [] { cuda::full({4}, 1, dtype::float32, 0); });
    check_no_device("cohort::cuda::zeros", [] { cuda::zeros({4}, dtype::float32, 0); });
    check_no_device("cohort::cuda::to_device", [] { cuda::to_device(tensor::zeros({4}, dtype::float32), 0); });
    // tensor::to reaches the layer through the core library.
    check_no_device("cohort::tensor::to", [] { (void)tensor::zeros({4}, dtype::float32).to(device{kDLCUDA, 0}); });
    check_no_device("cohort::cuda::synchronize", [] { cuda::synchronize(0); });
    check_no_device("cohort::cuda::empty_cache", [] { cuda::empty_cache(); });
    check_no_device("cohort::cuda::async_synchronize",
                    [] { cuda::async_synchronize(0, [](std::exception_ptr) { FAIL("completed without a device"); }); });
  }

  // Before, a copy from such a tensor went to the driver's contexts of a
  // device unchecked, and the process ended in SIGSEGV; a copy from one
  // device to another named cohort::cuda::synchronize.
  TEST_CASE("a device tensor on a device this process cannot use is refused where it is read, naming the call") {
    const tensor on_0 = posing_tensor(0), on_5 = posing_tensor(5);
    check_no_device("cohort::tensor::to", [&] { (void)on_0.to_cpu(); });
    check_no_device("cohort::tensor::to", [&] { (void)on_5.to(device{}); });
    check_no_device("cohort::tensor::to", [&] { (void)on_0.to(device{kDLCUDA, 1}); });
    check_no_device("cohort::tensor::to", [&] { (void)on_5.to(device{kDLCUDA, 0}); });
    check_no_device("cohort::cuda::to_cpu", [&] { (void)cuda::to_cpu(on_0); });
    check_no_device("cohort::cuda::to_cpu", [&] { (void)cuda::to_cpu(on_5); });
    check_no_device("cohort::cuda::clone", [&] { (void)on_0.clone(); });
    check_no_device("cohort::cuda::fill_", [&] { cuda::fill_(on_5, 2); });
  }

  // Before, the check ran in the wait's initiation, which use_awaitable runs
  // where nothing can catch: the process ended in std::terminate.
  TEST_CASE("an awaited wait without a device, or on an empty event, throws in the awaiting coroutine") {
    asio::io_context io;
    std::string synchronize_error, wait_error;
    bool after = false;
    const auto waits = [&]() -> asio::awaitable<void> {
      try {
        co_await cuda::async_synchronize(0);
      } catch (const cuda::no_device& e) {
        synchronize_error = e.what();
      }
      try {
        const cuda::event none;
        co_await none.async_wait();
      } catch (const std::logic_error& e) {
        wait_error = e.what();
      }
      after = true;
    };
    asio::co_spawn(io, waits(), asio::detached);
    io.run();
    CHECK(synchronize_error ==
          std::string("cohort::cuda::async_synchronize: no CUDA device: ") + cuda::unavailable_reason());
    CHECK(wait_error == "cohort::cuda::event::async_wait: an empty event");
    CHECK(after);
  }

  TEST_CASE("a device tensor's record, received without a device, is a decode_error naming the reason") {
    // What a sender on a device would write, with a note of 16 bytes: the
    // reader, registered as the library loads, refuses it before any device
    // is asked for.
    auto record = test::made_up_record::block_of(7, {});
    record.note_bytes = 16;
    CHECK_THROWS_WITH_AS((void)record.receive(), doctest::Contains("a device tensor's note of 16 bytes"), decode_error);
  }

  TEST_CASE("no_device is a cohort::cuda::error, and its code names CUDA's reason") {
    try {
      cuda::chunk::create(0, 1);
      FAIL("no exception");
    } catch (const cuda::error& e) {
      CHECK(dynamic_cast<const cuda::no_device*>(&e) != nullptr);
      CHECK(e.code() != 0);
      CHECK(e.name().starts_with("cudaError"));
    }
  }

  TEST_CASE("an empty chunk or event is refused as empty") {
    const cuda::chunk c;
    CHECK_FALSE(c);
    CHECK(c.data() == nullptr);
    CHECK_THROWS_AS(c.export_fd(), std::logic_error);
    CHECK_THROWS_AS(c.ipc_handle(), std::logic_error);
    cuda::event e;
    CHECK_FALSE(e);
    CHECK_THROWS_AS(e.record(nullptr), std::logic_error);
    CHECK_THROWS_AS(e.query(), std::logic_error);
    CHECK_THROWS_AS(e.ipc_handle(), std::logic_error);
  }
}

TEST_SUITE("cuda errors and UUIDs") {
  TEST_CASE("an error names the context, the call, the code's name and CUDA's description") {
    const cuda::error e("cohort::cuda::chunk::create: 2097152 bytes (2.0 MiB) on device 0", "cuMemCreate", 2,
                        "CUDA_ERROR_OUT_OF_MEMORY", "out of memory");
    CHECK(std::string(e.what()) ==
          "cohort::cuda::chunk::create: 2097152 bytes (2.0 MiB) on device 0: cuMemCreate failed: "
          "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    CHECK(e.call() == "cuMemCreate");
    CHECK(e.code() == 2);
    CHECK(e.name() == "CUDA_ERROR_OUT_OF_MEMORY");
  }

  TEST_CASE("a UUID is written as nvidia-smi writes it, and reads back") {
    cuda::uuid id;
    for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<unsigned char>(0x10 * i + 0x0f - i);
    const std::string text = cuda::to_string(id);
    CHECK(text == "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    CHECK(cuda::parse_uuid(text) == id);
    CHECK(cuda::parse_uuid("GPU-0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0") == id);
  }

  TEST_CASE("text that is not a UUID is not read as one") {
    for (const char* text : {"", "GPU-", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                             "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f",     // a digit short
                             "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f00",   // a digit more
                             "GPU-0f1e2d3c4b5a-6978-8796-a5b4c3d2e1f0-",    // a dash moved
                             "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg",    // not hex
                             "MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}) {
      CAPTURE(text);
      CHECK_FALSE(cuda::parse_uuid(text).has_value());
    }
  }
}
