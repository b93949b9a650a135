#pragma once
// The message of a caught exception without c10's C++ backtrace, for wrapping in our own.
#include <exception>

#include <c10/util/Exception.h>

namespace zero::adapter {

inline const char* message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

}  // namespace zero::adapter
