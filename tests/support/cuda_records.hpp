// A device tensor's record as a sender writes it (its note's storage
// handle, then its byte count, sender, port and event slot), made up field
// by field, so that tests can hand a receiver what no sender would.
#pragma once

#include "cuda/arena.hpp"

#include <cohort/encoding.hpp>
#include <cohort/storage.hpp>

#include <dlpack/dlpack.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace cohort::test {

struct made_up_record {
  cuda::detail::chunk_note note{};
  std::uint64_t nbytes = 16;
  std::uint32_t sender = static_cast<std::uint32_t>(::getpid());
  std::uint32_t port = 1;
  std::uint32_t slot = 0;
  std::uint32_t zero = 0;
  /// The bytes of the note's storage: chunk_note::expected_magic and the
  /// other fields as given, or a shorter or longer note.
  std::size_t note_bytes = cuda::detail::note_bytes;

  /// A note that holds together: a block of 512 bytes at 4096 in a 2 MiB
  /// chunk of this process, on the device whose UUID is `device`.
  static made_up_record block_of(std::uint64_t chunk_id, const std::array<unsigned char, 16>& device) {
    made_up_record r;
    r.note.magic = cuda::detail::chunk_note::expected_magic;
    r.note.maker = static_cast<std::uint32_t>(::getpid());
    r.note.maker_port = 1;
    r.note.chunk_id = chunk_id;
    r.note.chunk_size = std::uint64_t{2} << 20;
    r.note.offset = 4096;
    r.note.capacity = 512;
    r.note.device = device;
    return r;
  }

  /// The note's storage: chunk_note::expected_magic and the other fields
  /// as given, or a shorter or longer note.
  cohort::storage note_storage() const {
    auto s = cohort::storage::allocate_shared(note_bytes);
    std::memset(s.data(), 0, note_bytes);  // its counters start at 0 in a reused block too
    std::memcpy(s.data(), &note, std::min(sizeof note, note_bytes));
    return s;
  }

  /// Appends what follows the note's handle: the byte count, sender, port,
  /// event slot and padding.
  void append_fields(std::vector<std::byte>& out) const {
    for (auto [field, size] : {std::pair<const void*, std::size_t>{&nbytes, 8}, {&sender, 4}, {&port, 4},
                               {&slot, 4}, {&zero, 4}}) {
      const auto* at = static_cast<const std::byte*>(field);
      out.insert(out.end(), at, at + size);
    }
  }

  /// Reads the record back as a receiver reads one.
  cohort::storage receive() const {
    const auto note_storage = this->note_storage();
    std::vector<std::byte> bytes;
    {
      cohort::detail::handle_context context;
      cohort::detail::handle_scope scope(context);
      bytes.push_back(std::byte{2});
      bytes.push_back(static_cast<std::byte>(kDLCUDA));
      cohort::detail::handle_codec<cohort::storage>::write(bytes, note_storage);
      append_fields(bytes);
    }
    cohort::detail::reader in(bytes);
    return cohort::detail::handle_codec<cohort::storage>::read(in);
  }
};

/// Device memory whose handle is a made-up record over `note`, written as
/// the device layer writes its own (after the core's [2][kDLCUDA]).
class made_up_memory final : public cohort::detail::device_memory {
 public:
  made_up_memory(made_up_record record, cohort::storage note) : record_(record), note_(std::move(note)) {}
  std::byte* data() const noexcept override { return nullptr; }
  std::size_t nbytes() const noexcept override { return record_.nbytes; }
  int device_type() const noexcept override { return kDLCUDA; }
  int device_index() const noexcept override { return 0; }
  std::size_t handle_bound() const noexcept override {
    return cohort::detail::handle_codec<cohort::storage>::handle_size + 24;
  }
  void write(std::vector<std::byte>& out) const override {
    cohort::detail::handle_codec<cohort::storage>::write(out, note_);
    record_.append_fields(out);
  }

 private:
  made_up_record record_;
  cohort::storage note_;
};

}  // namespace cohort::test
