// Reads the chat's input lines. On a terminal (and with libedit) the line can
// be edited and earlier lines recalled with the arrow keys; from a pipe or a
// file it reads plain lines, so scripts and tests see no escape sequences.
//
// Ctrl-C (SIGINT) never kills the chat: while the handler is installed it
// only sets a flag. A read interrupted by it returns kInterrupted; a long
// operation polls interrupted() and stops early (an answer in progress).
#pragma once

#include <memory>
#include <string>

namespace ebb::cli {

class LineReader {
 public:
  // kTooLong: a line from a pipe or a file passed max_line bytes; what was
  // read of it is dropped (reading stops there, so /dev/zero cannot grow
  // the chat's memory).
  enum class Status { kLine, kEof, kInterrupted, kTooLong };

  // Installs the SIGINT handler (restored by the destructor).
  LineReader();
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Shows `prompt` on stderr and reads one line, without its newline.
  Status read(const char* prompt, std::string& line);

  // Longest line read from a pipe or a file (default: no limit).
  void set_max_line(size_t bytes);

  // Whether Ctrl-C came since the last clear_interrupt().
  static bool interrupted();
  static void clear_interrupt();
  // True when the terminal editor is in use.
  bool editing() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ebb::cli
