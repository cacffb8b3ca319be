#include "model/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "model/jinja/value.h"

namespace ebb::jinja {

LineIndex::LineIndex(std::string_view s) {
  starts_.push_back(0);
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n') starts_.push_back(uint32_t(i + 1));
}

void LineIndex::locate(uint32_t offset, int& line, int& col) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
  size_t idx = size_t(it - starts_.begin()) - 1;
  line = int(idx + 1);
  col = int(offset - starts_[idx] + 1);
}

std::string normalize_source(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

struct Lexer {
  const std::string& s;
  uint32_t& err_off;
  std::vector<Token> out;
  size_t pos = 0;
  bool line_starting = true;

  [[noreturn]] void fail(size_t at, const std::string& msg) {
    err_off = uint32_t(at);
    throw Fail(msg);
  }

  void emit(Tok t, std::string text, size_t off) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    tok.offset = uint32_t(off);
    out.push_back(std::move(tok));
  }

  // Applies "-" / lstrip_blocks to the text before a tag and emits it.
  void emit_text(size_t start, size_t end, char sign, bool lstrip_kind) {
    std::string_view text(s.data() + start, end - start);
    if (sign == '-') {
      size_t n = text.size();
      while (n > 0 && is_space(text[n - 1])) --n;
      text = text.substr(0, n);
    } else if (sign != '+' && lstrip_kind) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        bool ws = true;
        for (size_t i = l_pos; i < text.size(); ++i)
          if (!is_space(text[i])) {
            ws = false;
            break;
          }
        if (ws) text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) emit(Tok::Text, std::string(text), start);
  }

  // After a closing "%}" or "#}" at `p` (pointing past it), with the sign
  // before it: consumes what trim_blocks or "-" remove; returns the new pos.
  size_t after_block_end(size_t p, char sign) {
    if (sign == '-') {
      while (p < s.size() && is_space(s[p])) ++p;
    } else if (sign != '+' && p < s.size() && s[p] == '\n') {
      ++p;
    }
    line_starting = p > 0 && s[p - 1] == '\n';
    return p;
  }

  // Is there "{%[-+]? \s* WORD \s* [-+]?%}" at p? Returns the end or npos;
  // `open_sign`/`close_sign` receive the signs.
  size_t match_word_tag(size_t p, std::string_view word, char& open_sign, char& close_sign) {
    if (s.compare(p, 2, "{%") != 0) return std::string::npos;
    size_t q = p + 2;
    open_sign = 0;
    if (q < s.size() && (s[q] == '-' || s[q] == '+')) open_sign = s[q++];
    while (q < s.size() && is_space(s[q])) ++q;
    if (s.compare(q, word.size(), word) != 0) return std::string::npos;
    q += word.size();
    if (q < s.size() && (is_name_start(s[q]) || is_digit(s[q]))) return std::string::npos;
    while (q < s.size() && is_space(s[q])) ++q;
    close_sign = 0;
    if (q < s.size() && (s[q] == '-' || s[q] == '+')) close_sign = s[q++];
    if (s.compare(q, 2, "%}") != 0) return std::string::npos;
    return q + 2;
  }

  void run() {
    while (pos < s.size()) {
      size_t tag = pos;
      for (;;) {
        tag = s.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= s.size()) {
          tag = std::string::npos;
          break;
        }
        char c = s[tag + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++tag;
      }
      if (tag == std::string::npos) {
        emit(Tok::Text, s.substr(pos), pos);
        return;
      }
      char kind = s[tag + 1];
      char sign = 0;
      if (tag + 2 < s.size() && (s[tag + 2] == '-' || (s[tag + 2] == '+' && kind != '{'))) sign = s[tag + 2];
      char os = 0, cs = 0;
      if (kind == '%') {
        size_t raw_end = match_word_tag(tag, "raw", os, cs);
        if (raw_end != std::string::npos && cs != '+') {  // "{% raw +%}" is not a raw tag to Jinja2
          emit_text(pos, tag, os, true);
          raw_block(tag, raw_end, cs);
          continue;
        }
      }
      emit_text(pos, tag, sign, kind != '{');
      line_starting = false;
      size_t p = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t end = s.find("#}", p);
        if (end == std::string::npos) fail(tag, "missing end of comment tag");
        char esign = (end > p && (s[end - 1] == '-' || s[end - 1] == '+')) ? s[end - 1] : 0;
        pos = after_block_end(end + 2, esign);
        continue;
      }
      emit(kind == '%' ? Tok::BlockBegin : Tok::VarBegin, "", tag);
      pos = expression(p, kind == '%');
    }
  }

  void raw_block(size_t tag, size_t p, char open_close_sign) {
    if (open_close_sign == '-')
      while (p < s.size() && is_space(s[p])) ++p;
    size_t q = p;
    for (;;) {
      q = s.find("{%", q);
      if (q == std::string::npos) fail(tag, "missing end of raw directive");
      char os = 0, cs = 0;
      size_t end = match_word_tag(q, "endraw", os, cs);
      if (end != std::string::npos) {
        line_starting = false;
        emit_text(p, q, os, true);
        pos = after_block_end(end, cs);
        return;
      }
      q += 2;
    }
  }

  // Lexes inside a tag from p; returns the position after its end.
  size_t expression(size_t p, bool block) {
    std::vector<char> stack;
    size_t start_tag = p;
    for (;;) {
      while (p < s.size() && is_space(s[p])) ++p;
      if (p >= s.size()) fail(start_tag, block ? "unexpected end of template: missing '%}'" : "unexpected end of template: missing '}}'");
      if (stack.empty()) {
        if (block) {
          if (s.compare(p, 2, "%}") == 0) {
            emit(Tok::BlockEnd, "", p);
            return after_block_end(p + 2, 0);
          }
          if ((s[p] == '-' || s[p] == '+') && s.compare(p + 1, 2, "%}") == 0) {
            emit(Tok::BlockEnd, "", p);
            return after_block_end(p + 3, s[p]);
          }
        } else {
          if (s.compare(p, 2, "}}") == 0) {
            emit(Tok::VarEnd, "", p);
            line_starting = false;
            return p + 2;
          }
          if (s[p] == '-' && s.compare(p + 1, 2, "}}") == 0) {
            emit(Tok::VarEnd, "", p);
            return after_block_end(p + 3, '-');
          }
        }
      }
      char c = s[p];
      if (is_name_start(c) || (unsigned char)c >= 0x80) {
        size_t q = p;
        while (q < s.size() && (is_name_start(s[q]) || is_digit(s[q]))) ++q;
        if (q == p) fail(p, "unexpected character in expression");
        emit(Tok::Name, s.substr(p, q - p), p);
        p = q;
      } else if (is_digit(c)) {
        p = number(p);
      } else if (c == '\'' || c == '"') {
        p = string_lit(p);
      } else {
        static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (s.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-*/%~()[]{}<>=.:|,;", c)) fail(p, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (c == '(' || c == '[' || c == '{') stack.push_back(c);
        if (c == ')' || c == ']' || c == '}') {
          char want = c == ')' ? '(' : c == ']' ? '[' : '{';
          if (stack.empty() || stack.back() != want) fail(p, std::string("unexpected '") + c + "'");
          stack.pop_back();
        }
        emit(Tok::Op, op, p);
        p += op.size();
      }
    }
  }

  size_t number(size_t p) {
    size_t q = p;
    auto digits = [&](size_t& i) {
      size_t b = i;
      while (i < s.size() && (is_digit(s[i]) || (s[i] == '_' && i > b && i + 1 < s.size() && is_digit(s[i + 1])))) ++i;
      return i > b;
    };
    digits(q);
    bool is_float = false;
    if (q + 1 < s.size() && s[q] == '.' && is_digit(s[q + 1])) {
      ++q;
      digits(q);
      is_float = true;
    }
    if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
      size_t r = q + 1;
      if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
      if (r < s.size() && is_digit(s[r])) {
        digits(r);
        q = r;
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = p; i < q; ++i)
      if (s[i] != '_') text += s[i];
    Token tok;
    tok.offset = uint32_t(p);
    tok.text = text;
    errno = 0;
    if (is_float) {
      tok.type = Tok::Float;
      tok.fval = std::strtod(text.c_str(), nullptr);
    } else {
      tok.type = Tok::Int;
      tok.ival = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(p, "integer literal too large");
    }
    out.push_back(std::move(tok));
    return q;
  }

  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  size_t string_lit(size_t p) {
    char q = s[p];
    size_t i = p + 1;
    std::string v;
    for (;;) {
      if (i >= s.size()) fail(p, "unterminated string literal");
      char c = s[i];
      if (c == q) break;
      if (c != '\\') {
        v += c;
        ++i;
        continue;
      }
      if (i + 1 >= s.size()) fail(p, "unterminated string literal");
      char e = s[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'n': v += '\n'; break;
        case 'r': v += '\r'; break;
        case 't': v += '\t'; break;
        case 'v': v += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            int h = i < s.size() ? hexval(s[i]) : -1;
            if (h < 0) fail(i, "truncated \\" + std::string(1, e) + " escape in string literal");
            cp = cp * 16 + uint32_t(h);
            ++i;
          }
          if (cp > 0x10FFFF) fail(i, "illegal Unicode character in string literal");
          append_utf8(v, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k) cp = cp * 8 + uint32_t(s[i++] - '0');
            append_utf8(v, cp);
          } else {
            v += '\\';
            v += e;
          }
      }
    }
    emit(Tok::String, std::move(v), p);
    return i + 1;
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, uint32_t& error_offset) {
  Lexer lx{source, error_offset, {}};
  lx.run();
  Token end;
  end.type = Tok::End;
  end.offset = uint32_t(source.size());
  lx.out.push_back(std::move(end));
  return std::move(lx.out);
}

}  // namespace ebb::jinja
