// jinja_tool: renders a chat template with fsdp::chat::Template, for chat_template_python_test.py
// to compare with transformers.
//
//   jinja_tool [--now EPOCH] [--spans] TEMPLATE_FILE VARS_JSON_FILE
//       prints the rendering exactly (no newline added); --spans prints {"text": ...,
//       "generation_spans": [[begin, end], ...] (bytes), "generation_char_spans": (code points)}.
//   jinja_tool [--now EPOCH] --batch TEMPLATE_FILE VARS_JSON_FILE
//       VARS_JSON_FILE holds an array of variable objects; prints one JSON object per line:
//       {"text", "generation_spans", "generation_char_spans"}, {"raise": message} or {"error": message}.
//   jinja_tool --bench N TEMPLATE_FILE VARS_JSON_FILE
//       renders each variable object of the array N times; prints {"renders", "seconds"}.
//   jinja_tool --training FOLDER RECORDS_JSON_FILE TEMPLATE_FILE...
//       for each template in turn, a line of what `fsdptrain chat-template` prints for the first record
//       of the array that it renders (FOLDER: the tokenizer folder, for its special tokens):
//       {"text", "assistant_spans" (code points), "rule"}, else {"error": the last record's message}, with
//       the record's index ("record"); a turn whose spans cannot be found is the template's answer, no later
//       record tried.
// Exit status: 0, 2 for a template or input error (message on stderr), 3 for raise_exception.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "chat/jinja_unicode.h"
#include "util/error.h"

namespace {

using fsdp::chat::Json;
using fsdp::chat::Template;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fsdp::InputError("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Code points of `text` before byte `byte`, as fsdptrain chat-template counts its spans.
size_t code_points(const std::string& text, size_t byte) {
  return fsdp::chat::jinja::utf8_length(std::string_view(text).substr(0, byte));
}

Json spans_json(const Template::Output& out) {
  Json spans = Json::array(), char_spans = Json::array();
  for (const auto& [b, e] : out.generation_spans) spans.push_back({b, e});
  for (const auto& [b, e] : out.generation_char_spans) char_spans.push_back({b, e});
  return Json{{"text", out.text}, {"generation_spans", spans}, {"generation_char_spans", char_spans}};
}

int batch(const Template& t, const Json& all, std::time_t now) {
  for (const Json& vars : all) {
    Json line;
    try {
      line = spans_json(t.render(vars, now));
    } catch (const fsdp::chat::TemplateRaise& e) {
      line = {{"raise", e.what()}};
    } catch (const fsdp::Error& e) {
      line = {{"error", e.what()}};
    }
    std::cout << line.dump() << "\n";
  }
  return 0;
}

int bench(const Template& t, const Json& all, long n, std::time_t now) {
  const auto start = std::chrono::steady_clock::now();
  size_t bytes = 0;
  long renders = 0;
  for (long i = 0; i < n; ++i) {
    for (const Json& vars : all) {
      try {
        bytes += t.render(vars, now).text.size();
      } catch (const fsdp::Error&) {
      }
      ++renders;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << Json{{"renders", renders}, {"seconds", seconds}, {"bytes", bytes}}.dump() << "\n";
  return 0;
}

// --training's line for one template: the first of `records` it renders, or the error that ends the search.
Json training_line(const std::string& folder, const std::string& file, const Json& records) {
  Json line;
  try {
    const fsdp::chat::ChatTemplate t = fsdp::chat::ChatTemplate::load(folder, file);
    for (size_t i = 0; i < records.size(); ++i) {
      try {
        const fsdp::chat::ChatTemplate::Training r =
            t.render_for_training(fsdp::chat::read_conversation(records[i], true), /*assistant_only=*/true);
        Json spans = Json::array();
        for (const auto& [b, e] : r.counted) spans.push_back({code_points(r.text, b), code_points(r.text, e)});
        return {{"text", r.text}, {"assistant_spans", spans}, {"rule", r.rule}, {"record", i}};
      } catch (const fsdp::Error& e) {
        line = {{"error", e.what()}, {"record", i}};
        if (std::string(e.what()).find("cannot be found in the whole rendering") != std::string::npos) break;
      }
    }
  } catch (const fsdp::Error& e) {  // the template itself
    line = {{"error", e.what()}, {"record", 0}};
  }
  return line;
}

int training(const std::string& folder, const Json& records, const std::vector<std::string>& templates) {
  for (const std::string& file : templates)
    std::cout << training_line(folder, file, records).dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool spans = false, batch_mode = false;
  long bench_n = 0;
  std::time_t now = std::time(nullptr);
  std::vector<std::string> files;
  if (argc >= 4 && std::string(argv[1]) == "--training") {
    try {
      return training(argv[2], Json::parse(read_file(argv[3])), std::vector<std::string>(argv + 4, argv + argc));
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--spans") {
      spans = true;
    } else if (a == "--batch") {
      batch_mode = true;
    } else if ((a == "--bench" || a == "--now") && i + 1 < argc) {
      if (a == "--bench") {
        bench_n = std::atol(argv[++i]);
      } else {
        now = static_cast<std::time_t>(std::atoll(argv[++i]));
      }
    } else {
      files.push_back(a);
    }
  }
  try {
    if (files.size() != 2) {
      throw fsdp::InputError(
          "usage: jinja_tool [--spans|--batch|--bench N] [--now EPOCH] TEMPLATE_FILE VARS_JSON_FILE | "
          "jinja_tool --training FOLDER RECORDS_JSON_FILE TEMPLATE_FILE...");
    }
    const Template t(read_file(files[0]), files[0]);
    const Json vars = Json::parse(read_file(files[1]));
    if (batch_mode) return batch(t, vars, now);
    if (bench_n > 0) return bench(t, vars, bench_n, now);
    const Template::Output out = t.render(vars, now);
    if (spans) {
      std::cout << spans_json(out).dump();
    } else {
      std::cout.write(out.text.data(), static_cast<std::streamsize>(out.text.size()));
    }
    return 0;
  } catch (const fsdp::chat::TemplateRaise& e) {
    std::cerr << e.what() << "\n";
    return 3;
  } catch (const fsdp::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const Json::exception& e) {
    std::cerr << files.back() << ": " << e.what() << "\n";
    return 2;
  }
}
