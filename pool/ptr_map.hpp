// Address -> value (the pool's allocated blocks; the shim's live table).
// Open addressing with linear probing and backward-shift deletion: no
// tombstones, no allocation per insert, one cache line per lookup in the
// common case. Addresses are multiples of 512, so the hash drops those bits
// first. Address 0 marks an empty slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pool/block.hpp"

namespace gpupool {

template <typename Value>
class AddressMap {
 public:
  explicit AddressMap(std::size_t capacity = kInitialCapacity) : slots_(capacity), most_(capacity * 3 / 4) {}

  // The value stored for `key`, or null.
  const Value* find(DevicePtr key) const {
    if (key == 0) return nullptr;
    for (std::size_t i = home(key);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == 0) return nullptr;
    }
  }

  Value* find(DevicePtr key) { return const_cast<Value*>(static_cast<const AddressMap*>(this)->find(key)); }

  // Inserts or replaces.
  void insert(DevicePtr key, const Value& value) {
    reserve_one();
    place(key, value);
  }

  // Room for one more key: the next insert allocates nothing (and cannot throw).
  void reserve_one() {
    if (size_ >= most_) grow();
  }

  bool erase(DevicePtr key) {
    if (key == 0) return false;
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask()) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return false;
    }
    // Backward shift: pull later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask();; j = (j + 1) & mask()) {
      if (slots_[j].key == 0) break;
      const std::size_t h = home(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool home_after_hole = ((j - h) & mask()) < ((j - hole) & mask());
      if (!home_after_hole) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.key != 0) f(s.key, s.value);
    }
  }

 private:
  struct Slot {
    DevicePtr key = 0;
    Value value{};
  };
  static constexpr std::size_t kInitialCapacity = 1024;

  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t home(DevicePtr key) const {
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & mask();
  }

  void place(DevicePtr key, const Value& value) {
    for (std::size_t i = home(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) {
        slots_[i].value = value;
        return;
      }
      if (slots_[i].key == 0) {
        slots_[i] = Slot{key, value};
        ++size_;
        return;
      }
    }
  }

  [[gnu::noinline, gnu::cold]] void grow() {  // rare: kept off the insert path
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    most_ = slots_.size() * 3 / 4;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != 0) place(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t most_;  // keys before the table grows: at most 3/4 of the slots in use
  std::size_t size_ = 0;
};

// The pool's allocated blocks by address.
class PtrMap : public AddressMap<Block*> {
 public:
  Block* find(DevicePtr key) const {
    const auto* v = AddressMap<Block*>::find(key);
    return v != nullptr ? *v : nullptr;
  }
};

}  // namespace gpupool
