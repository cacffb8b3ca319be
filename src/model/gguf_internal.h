// Helpers shared by the GGUF reader, writer and metadata look-ups. Private to
// src/model/gguf*.cpp; other code uses model/gguf.h.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "model/gguf.h"

namespace ebb {

// Builds the "<path>: <where>: <field>: <problem>" messages of ebb::Error, so
// every failure names the file, the entry being parsed and the field.
struct GgufErrorContext {
  const std::string& path;
  std::string where;  // e.g. "metadata key 'general.name'"; empty in the header
  [[noreturn]] void fail(std::string_view field, const std::string& problem) const;
  // "<path>: <where>: <text>", for messages that read better without the
  // field/problem split.
  [[noreturn]] void fail_text(const std::string& text) const;
};

// A name as it appears in messages: quoted, non-printable bytes escaped, cut
// to a readable length (hostile names can be megabytes long).
std::string gguf_quote(std::string_view s);
// "uint32", "array of string", "array of array of int32", ...
std::string gguf_describe(const GgufValue& v);

// Reads exactly n bytes at offset, retrying on EINTR and short reads. Throws
// ebb::Error naming the path on an I/O error or an unexpected end of file.
void gguf_pread_full(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path);

FileIdentity gguf_identity(const struct stat& st);

}  // namespace ebb
