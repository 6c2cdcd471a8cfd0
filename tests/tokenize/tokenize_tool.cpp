// tokenize_tool TOKENIZER_JSON: reads documents as hex strings (one per line, so any bytes, invalid
// UTF-8 included, pass unchanged) from stdin and writes {"ids": [...], "decoded": "..."} per line,
// for tokenizer_python_test.py to compare with the Python `tokenizers` package.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenize/tokenizer.h"
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
      const nlohmann::json out = {{"ids", ids}, {"decoded", tok.decode(ids)}};
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    return 0;
  } catch (const fsdp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  }
}
