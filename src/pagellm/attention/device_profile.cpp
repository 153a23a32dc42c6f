#include "pagellm/attention/device_profile.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <sstream>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

// Parses a non-negative decimal integer that fills `text`; false otherwise.
bool parse_uint(const std::string& text, int64_t& out) {
  if (text.empty() || text.size() > 9) return false;
  int64_t v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

}  // namespace

std::string cudnn_version_string(CudnnVersion v) {
  if (v <= 0) return "none";
  std::ostringstream s;
  s << v / 10000 << '.' << (v / 100) % 100 << '.' << v % 100;
  return s.str();
}

CudnnVersion parse_cudnn_version(const std::string& text) {
  if (text == "none") return 0;
  int64_t plain = 0;
  if (parse_uint(text, plain)) {
    PAGELLM_CHECK(plain == 0 || (plain >= 90000 && plain < 1000000))
        << "cuDNN version " << text
        << " is not in cudnnGetVersion()'s cuDNN 9 form (major*10000 + minor*100 + patch, "
           "e.g. 91400) nor 'none'";
    return static_cast<CudnnVersion>(plain);
  }
  // "major.minor[.patch]"
  int64_t parts[3] = {0, 0, 0};
  int n = 0;
  std::string item;
  std::stringstream ss(text);
  bool ok = true;
  while (std::getline(ss, item, '.')) {
    if (n >= 3 || !parse_uint(item, parts[n])) {
      ok = false;
      break;
    }
    ++n;
  }
  ok = ok && n >= 2 && parts[0] >= 9 && parts[0] < 100 && parts[1] < 100 && parts[2] < 100;
  PAGELLM_CHECK(ok) << "cannot read cuDNN version '" << text
                    << "' (expected e.g. 9.14.0, 9.14, 91400 or none; cuDNN 9 or newer)";
  return static_cast<CudnnVersion>(parts[0] * 10000 + parts[1] * 100 + parts[2]);
}

std::string DeviceProfile::compute_capability() const {
  return std::to_string(cc_major) + "." + std::to_string(cc_minor);
}

std::string DeviceProfile::describe() const {
  std::ostringstream s;
  s << (name.empty() ? "(unnamed device)" : name) << " (" << sm_count
    << " SMs, compute capability " << compute_capability() << "), cuDNN "
    << cudnn_version_string(cudnn_version);
  return s.str();
}

void parse_compute_capability(const std::string& text, int32_t& major, int32_t& minor) {
  const size_t dot = text.find('.');
  int64_t a = 0, b = 0;
  const bool ok = dot != std::string::npos && parse_uint(text.substr(0, dot), a) &&
                  parse_uint(text.substr(dot + 1), b) && a > 0 && a < 100 && b < 100;
  PAGELLM_CHECK(ok) << "cannot read compute capability '" << text << "' (expected e.g. 9.0)";
  major = static_cast<int32_t>(a);
  minor = static_cast<int32_t>(b);
}

DeviceProfile parse_device_profile_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PAGELLM_FAIL() << origin << ": not valid JSON (" << e.what() << ")";
  }
  PAGELLM_CHECK(j.is_object()) << origin << ": a device profile must be a JSON object";
  DeviceProfile p;
  PAGELLM_CHECK(j.contains("name") && j["name"].is_string() && !j["name"].get<std::string>().empty())
      << origin << ": device profile needs \"name\" (a non-empty string, e.g. \"NVIDIA H200\")";
  p.name = j["name"].get<std::string>();
  PAGELLM_CHECK(j.contains("sm_count") && j["sm_count"].is_number_integer() &&
                j["sm_count"].get<int64_t>() > 0 && j["sm_count"].get<int64_t>() < 100000)
      << origin << ": device profile needs \"sm_count\" (a positive integer)";
  p.sm_count = j["sm_count"].get<int32_t>();
  PAGELLM_CHECK(j.contains("compute_capability") && j["compute_capability"].is_string())
      << origin << ": device profile needs \"compute_capability\" (a string such as \"9.0\")";
  try {
    parse_compute_capability(j["compute_capability"].get<std::string>(), p.cc_major, p.cc_minor);
  } catch (const Error& e) {
    PAGELLM_FAIL() << origin << ": " << e.what();
  }
  if (j.contains("cudnn_version")) {
    const auto& v = j["cudnn_version"];
    try {
      if (v.is_string()) {
        p.cudnn_version = parse_cudnn_version(v.get<std::string>());
      } else if (v.is_number_integer()) {
        p.cudnn_version = parse_cudnn_version(std::to_string(v.get<int64_t>()));
      } else {
        PAGELLM_FAIL() << "\"cudnn_version\" must be a string such as \"9.14.0\" or an integer "
                          "such as 91400";
      }
    } catch (const Error& e) {
      PAGELLM_FAIL() << origin << ": " << e.what();
    }
  }
  return p;
}

std::string device_profile_to_json(const DeviceProfile& p) {
  nlohmann::json j = {{"name", p.name},
                      {"sm_count", p.sm_count},
                      {"compute_capability", p.compute_capability()},
                      {"cudnn_version", cudnn_version_string(p.cudnn_version)}};
  return j.dump(2);
}

}  // namespace pagellm
