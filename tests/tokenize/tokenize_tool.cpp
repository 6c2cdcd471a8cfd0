// tokenize_tool TOKENIZER_JSON: reads documents as hex strings (one per line, so any bytes, invalid
// UTF-8 included, pass unchanged) from stdin and writes {"ids": [...], "decoded": "...", "offsets":
// [[b, e], ...]} per line, for tokenizer_python_test.py to compare with the Python `tokenizers`
// package. "offsets" are those of encode(text, add_special_tokens=false), in code points as
// tokenizers counts them (a token inside a character covers the character); only for valid UTF-8.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenize/tokenizer.h"
#include "tokenize/unicode.h"
#include "util/error.h"

int main(int argc, char** argv) {
  try {
    if (argc != 2) throw fsdp::InputError("usage: tokenize_tool TOKENIZER_JSON < HEX_LINES");
    const fsdp::tokenize::Tokenizer tok = fsdp::tokenize::Tokenizer::load(argv[1]);
    std::string line;
    while (std::getline(std::cin, line)) {
      std::string text;
      for (size_t i = 0; i + 1 < line.size(); i += 2) text += static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16));
      const std::vector<int32_t> ids = tok.encode(text);
      nlohmann::json out = {{"ids", ids}, {"decoded", tok.decode(ids)}};
      if (fsdp::tokenize::repair_utf8(text) == text) {
        std::vector<size_t> char_at(text.size() + 1, 0);  // byte -> the code point it is in
        size_t c = 0;
        for (size_t b = 0; b < text.size(); ++b) {
          if (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) != 0x80) ++c;
          char_at[b] = c;
        }
        const size_t chars = text.empty() ? 0 : c + 1;
        nlohmann::json spans = nlohmann::json::array();
        for (const auto& [b, e] : tok.offsets(text, tok.encode(text, false)))
          spans.push_back(b == e ? nlohmann::json::array({b < text.size() ? char_at[b] : chars,
                                                          b < text.size() ? char_at[b] : chars})
                                 : nlohmann::json::array({char_at[b], char_at[e - 1] + 1}));
        out["offsets"] = spans;
      }
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return 0;
  } catch (const fsdp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  }
}
