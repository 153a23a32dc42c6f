#include "pagellm/attention/crossover_table.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "pagellm/common/check.h"

namespace pagellm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Field readers: each names the file, the object and the field in its message.
struct Reader {
  const std::string& origin;
  std::string where;  // "entries[3]"

  std::string prefix() const { return origin + ": " + (where.empty() ? "" : where + ": "); }

  const json& field(const json& j, const char* key, const char* expected) const {
    PAGELLM_CHECK(j.contains(key)) << prefix() << "missing \"" << key << "\" (" << expected << ")";
    return j.at(key);
  }
  int64_t integer(const json& j, const char* key, int64_t min, int64_t max,
                  const char* expected) const {
    const json& v = field(j, key, expected);
    PAGELLM_CHECK(v.is_number_integer() && v.get<int64_t>() >= min && v.get<int64_t>() <= max)
        << prefix() << "\"" << key << "\" is " << v.dump() << ", expected " << expected;
    return v.get<int64_t>();
  }
  double number(const json& j, const char* key, const char* expected) const {
    const json& v = field(j, key, expected);
    PAGELLM_CHECK(v.is_number()) << prefix() << "\"" << key << "\" is " << v.dump()
                                 << ", expected " << expected;
    return v.get<double>();
  }
  std::string string(const json& j, const char* key, const char* expected) const {
    const json& v = field(j, key, expected);
    PAGELLM_CHECK(v.is_string()) << prefix() << "\"" << key << "\" is " << v.dump()
                                 << ", expected " << expected;
    return v.get<std::string>();
  }
  std::vector<int32_t> int_list(const json& j, const char* key, const char* expected) const {
    const json& v = field(j, key, expected);
    PAGELLM_CHECK(v.is_array() && !v.empty())
        << prefix() << "\"" << key << "\" is " << v.dump() << ", expected " << expected;
    std::vector<int32_t> out;
    for (const json& x : v) {
      PAGELLM_CHECK(x.is_number_integer() && x.get<int64_t>() >= 1 && x.get<int64_t>() <= 1 << 20)
          << prefix() << "\"" << key << "\" holds " << x.dump() << ", expected " << expected;
      out.push_back(x.get<int32_t>());
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  template <class F>
  auto wrap(F&& f) const -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      PAGELLM_FAIL() << prefix() << e.what();
    }
  }
};

constexpr int64_t kMaxWork = int64_t{1} << 62;

// A "class" field: parsed, and required to agree with the phase.
ShapeClass read_shape_class(const json& j, const Reader& r, AttentionPhase phase) {
  const std::string name =
      r.string(j, "class", "a shape class such as \"decode\" or \"q257-1024 kv4097-16384 uniform\"");
  const ShapeClass c = r.wrap([&] { return parse_shape_class(name); });
  PAGELLM_CHECK(shape_class_phase(c) == phase)
      << r.prefix() << "\"class\" is \"" << name << "\" but \"phase\" is " << phase_name(phase)
      << " (decode calls have the class \"decode\", prefill calls a query bucket from q2-64)";
  return c;
}

CrossoverMeasurement parse_measurement(const json& j, const Reader& r, bool v1) {
  PAGELLM_CHECK(j.is_object()) << r.prefix() << "a measurement must be an object";
  CrossoverMeasurement m;
  const std::string mode = r.string(j, "mode", "\"eager\" or \"graph\"");
  const std::string phase = r.string(j, "phase", "\"prefill\" or \"decode\"");
  m.mode = r.wrap([&] { return parse_launch_mode(mode); });
  m.phase = r.wrap([&] { return parse_attention_phase(phase); });
  m.head_dim = static_cast<int32_t>(r.integer(j, "head_dim", 1, 1024, "a head dim in [1, 1024]"));
  m.page_size = static_cast<int32_t>(r.integer(j, "page_size", 1, 1 << 20, "a positive page size"));
  m.num_q_heads = static_cast<int32_t>(r.integer(j, "num_q_heads", 1, 1 << 20, "a positive count"));
  m.num_kv_heads = static_cast<int32_t>(r.integer(j, "num_kv_heads", 1, 1 << 20, "a positive count"));
  m.num_seqs = static_cast<int32_t>(r.integer(j, "num_seqs", 1, INT32_MAX, "a positive count"));
  m.num_tokens = static_cast<int32_t>(r.integer(j, "num_tokens", 1, INT32_MAX, "a positive count"));
  m.max_query_len = static_cast<int32_t>(r.integer(j, "max_query_len", 1, INT32_MAX, "a positive length"));
  m.max_kv_len = static_cast<int32_t>(r.integer(j, "max_kv_len", 1, INT32_MAX, "a positive length"));
  const json& ragged = r.field(j, "ragged", "true or false");
  PAGELLM_CHECK(ragged.is_boolean()) << r.prefix() << "\"ragged\" must be true or false";
  m.ragged = ragged.get<bool>();
  m.work = r.integer(j, "work", 0, kMaxWork, "a non-negative work count");
  m.native_us = r.number(j, "native_us", "microseconds per call");
  m.cudnn_us = r.number(j, "cudnn_us", "microseconds per call, negative when cuDNN failed");
  PAGELLM_CHECK(m.native_us > 0) << r.prefix() << "\"native_us\" must be positive";
  if (v1) {
    // v1 grids were ragged in their query lengths whenever a prefill point was ragged.
    m.shape_class = classify_shape(m.max_query_len, m.num_tokens, m.max_kv_len,
                                   m.ragged && m.phase == AttentionPhase::kPrefill);
  } else {
    m.shape_class = read_shape_class(j, r, m.phase);
    const ShapeClass derived =
        classify_shape(m.max_query_len, m.num_tokens, m.max_kv_len, m.shape_class.ragged);
    PAGELLM_CHECK(derived == m.shape_class && (!m.shape_class.ragged || m.ragged))
        << r.prefix() << "\"class\" is \"" << shape_class_name(m.shape_class)
        << "\" but max_query_len " << m.max_query_len << ", num_tokens " << m.num_tokens
        << ", max_kv_len " << m.max_kv_len << " and ragged " << (m.ragged ? "true" : "false")
        << " make it \""
        << shape_class_name(
               classify_shape(m.max_query_len, m.num_tokens, m.max_kv_len, m.ragged))
        << "\"";
  }
  if (j.contains("label") && j["label"].is_string()) m.label = j["label"].get<std::string>();
  return m;
}

CrossoverEntry parse_entry(const json& j, const Reader& r) {
  PAGELLM_CHECK(j.is_object()) << r.prefix() << "an entry must be an object";
  CrossoverEntry e;
  const std::string mode = r.string(j, "mode", "\"eager\" or \"graph\"");
  const std::string phase = r.string(j, "phase", "\"prefill\" or \"decode\"");
  e.mode = r.wrap([&] { return parse_launch_mode(mode); });
  e.phase = r.wrap([&] { return parse_attention_phase(phase); });
  e.head_dim = static_cast<int32_t>(r.integer(j, "head_dim", 1, 1024, "a head dim in [1, 1024]"));
  e.shape_class = read_shape_class(j, r, e.phase);
  e.min_work = r.integer(j, "min_work", 0, kMaxWork, "a non-negative work count");
  e.max_work = r.integer(j, "max_work", e.min_work, kMaxWork, "a work count >= min_work");
  e.page_sizes = r.int_list(j, "page_sizes", "a non-empty list of measured page sizes");
  e.gqa_ratios = r.int_list(j, "gqa_ratios", "a non-empty list of measured GQA ratios");
  e.max_num_seqs = static_cast<int32_t>(r.integer(j, "max_num_seqs", 1, INT32_MAX, "a positive count"));
  e.max_query_len = static_cast<int32_t>(r.integer(j, "max_query_len", 1, INT32_MAX, "a positive length"));
  e.max_kv_len = static_cast<int32_t>(r.integer(j, "max_kv_len", 1, INT32_MAX, "a positive length"));
  if (j.contains("points")) e.points = static_cast<int32_t>(r.integer(j, "points", 0, INT32_MAX, "a count"));
  if (j.contains("admitted_points")) {
    e.admitted_points =
        static_cast<int32_t>(r.integer(j, "admitted_points", 0, INT32_MAX, "a count"));
  }
  return e;
}

json measurement_json(const CrossoverMeasurement& m) {
  json j = {{"mode", mode_name(m.mode)},
            {"phase", phase_name(m.phase)},
            {"head_dim", m.head_dim},
            {"page_size", m.page_size},
            {"num_q_heads", m.num_q_heads},
            {"num_kv_heads", m.num_kv_heads},
            {"num_seqs", m.num_seqs},
            {"num_tokens", m.num_tokens},
            {"max_query_len", m.max_query_len},
            {"max_kv_len", m.max_kv_len},
            {"ragged", m.ragged},
            {"class", shape_class_name(m.shape_class)},
            {"work", m.work},
            {"native_us", m.native_us},
            {"cudnn_us", m.cudnn_us}};
  if (!m.label.empty()) j["label"] = m.label;
  return j;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  PAGELLM_CHECK(f.good()) << "cannot read crossover table " << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

const CrossoverEntry* CrossoverTable::find(LaunchMode mode, AttentionPhase phase,
                                           int32_t head_dim, const ShapeClass& shape_class) const {
  for (const CrossoverEntry& e : entries) {
    if (e.mode == mode && e.phase == phase && e.head_dim == head_dim &&
        e.shape_class == shape_class) {
      return &e;
    }
  }
  return nullptr;
}

CrossoverTable parse_crossover_table(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    PAGELLM_FAIL() << origin << ": not valid JSON (" << e.what() << ")";
  }
  Reader r{origin, ""};
  PAGELLM_CHECK(j.is_object()) << origin << ": a crossover table must be a JSON object";
  const std::string format = r.string(j, "format", kCrossoverFormat);
  PAGELLM_CHECK(format == kCrossoverFormat || format == kCrossoverFormatV1)
      << origin << ": format \"" << format << "\" is not \"" << kCrossoverFormat << "\" (or \""
      << kCrossoverFormatV1 << "\" without entries)";
  const bool v1 = format == kCrossoverFormatV1;
  CrossoverTable t;
  t.origin = origin;
  {
    Reader dr{origin, "device"};
    const json& dev = r.field(j, "device", "an object with name, sm_count, compute_capability");
    PAGELLM_CHECK(dev.is_object()) << origin << ": \"device\" must be an object";
    t.device.name = dr.string(dev, "name", "the CUDA device name, e.g. \"NVIDIA H200\"");
    PAGELLM_CHECK(!t.device.name.empty()) << origin << ": device: \"name\" is empty";
    t.device.sm_count =
        static_cast<int32_t>(dr.integer(dev, "sm_count", 1, 100000, "a positive SM count"));
    const std::string cc = dr.string(dev, "compute_capability", "a string such as \"9.0\"");
    dr.wrap([&] {
      parse_compute_capability(cc, t.device.cc_major, t.device.cc_minor);
      return 0;
    });
  }
  {
    const json& v = r.field(j, "cudnn_version", "the cuDNN version measured, e.g. \"9.14.0\"");
    r.wrap([&] {
      if (v.is_string()) {
        t.device.cudnn_version = parse_cudnn_version(v.get<std::string>());
      } else if (v.is_number_integer()) {
        t.device.cudnn_version = parse_cudnn_version(std::to_string(v.get<int64_t>()));
      } else {
        PAGELLM_FAIL() << "\"cudnn_version\" must be a string such as \"9.14.0\"";
      }
      return 0;
    });
    PAGELLM_CHECK(t.device.cudnn_version > 0)
        << origin << ": \"cudnn_version\" must name a cuDNN release, not none";
  }
  if (j.contains("measured_on") && j["measured_on"].is_string()) {
    t.measured_on = j["measured_on"].get<std::string>();
  }
  if (j.contains("source") && j["source"].is_string()) t.source = j["source"].get<std::string>();
  if (j.contains("margin")) {
    t.margin = r.number(j, "margin", "a non-negative fraction");
    PAGELLM_CHECK(t.margin >= 0 && t.margin < 10) << origin << ": \"margin\" must be in [0, 10)";
  }
  const json& entries = r.field(j, "entries", "a list of crossover entries");
  PAGELLM_CHECK(entries.is_array()) << origin << ": \"entries\" must be a list";
  PAGELLM_CHECK(!v1 || entries.empty())
      << origin << ": format \"" << kCrossoverFormatV1 << "\" has " << entries.size()
      << " entries without a shape class; their single work threshold per mode, phase and "
         "head_dim cannot say in which shape classes cuDNN won, so they are not used. "
         "Re-measure with `pagellm calibrate-attention` (writes \""
      << kCrossoverFormat << "\"), or remove the file";
  for (size_t i = 0; i < entries.size(); ++i) {
    Reader er{origin, "entries[" + std::to_string(i) + "]"};
    CrossoverEntry e = parse_entry(entries[i], er);
    PAGELLM_CHECK(t.find(e.mode, e.phase, e.head_dim, e.shape_class) == nullptr)
        << er.prefix() << "a second entry for " << mode_name(e.mode) << " " << phase_name(e.phase)
        << " head_dim " << e.head_dim << " class " << shape_class_name(e.shape_class)
        << " (each combination may appear once)";
    t.entries.push_back(std::move(e));
  }
  if (j.contains("measurements")) {
    const json& ms = j["measurements"];
    PAGELLM_CHECK(ms.is_array()) << origin << ": \"measurements\" must be a list";
    for (size_t i = 0; i < ms.size(); ++i) {
      Reader mr{origin, "measurements[" + std::to_string(i) + "]"};
      t.measurements.push_back(parse_measurement(ms[i], mr, v1));
    }
  }
  return t;
}

std::string crossover_table_to_json(const CrossoverTable& t) {
  json entries = json::array();
  for (const CrossoverEntry& e : t.entries) {
    entries.push_back({{"mode", mode_name(e.mode)},
                       {"phase", phase_name(e.phase)},
                       {"head_dim", e.head_dim},
                       {"class", shape_class_name(e.shape_class)},
                       {"min_work", e.min_work},
                       {"max_work", e.max_work},
                       {"page_sizes", e.page_sizes},
                       {"gqa_ratios", e.gqa_ratios},
                       {"max_num_seqs", e.max_num_seqs},
                       {"max_query_len", e.max_query_len},
                       {"max_kv_len", e.max_kv_len},
                       {"points", e.points},
                       {"admitted_points", e.admitted_points}});
  }
  json ms = json::array();
  for (const CrossoverMeasurement& m : t.measurements) ms.push_back(measurement_json(m));
  json j = {{"format", kCrossoverFormat},
            {"device",
             {{"name", t.device.name},
              {"sm_count", t.device.sm_count},
              {"compute_capability", t.device.compute_capability()}}},
            {"cudnn_version", cudnn_version_string(t.device.cudnn_version)},
            {"measured_on", t.measured_on},
            {"source", t.source},
            {"margin", t.margin},
            {"entries", entries},
            {"measurements", ms}};
  return j.dump(2) + "\n";
}

std::vector<CrossoverEntry> derive_crossover_entries(
    const std::vector<CrossoverMeasurement>& measurements, double margin) {
  using Group = std::tuple<int, int, int32_t, int32_t>;  // mode, phase, head_dim, class
  std::map<Group, std::vector<const CrossoverMeasurement*>> groups;
  for (const CrossoverMeasurement& m : measurements) {
    groups[{static_cast<int>(m.mode), static_cast<int>(m.phase), m.head_dim,
            m.shape_class.code()}]
        .push_back(&m);
  }
  const auto win = [margin](const CrossoverMeasurement* m) {
    return m->cudnn_us > 0 && m->native_us > m->cudnn_us * (1.0 + margin);
  };
  std::vector<CrossoverEntry> out;
  for (auto& [key, points] : groups) {
    std::stable_sort(points.begin(), points.end(),
                     [](const CrossoverMeasurement* a, const CrossoverMeasurement* b) {
                       return a->work < b->work;
                     });
    const size_t n = points.size();
    // The first index from which every point is a win; a loss anywhere at a work value
    // excludes every point with that work too (ties must not start the range).
    size_t k = n;
    while (k > 0 && win(points[k - 1])) --k;
    while (k > 0 && k < n && points[k]->work == points[k - 1]->work) ++k;
    if (k == n) continue;
    CrossoverEntry e;
    e.mode = static_cast<LaunchMode>(std::get<0>(key));
    e.phase = static_cast<AttentionPhase>(std::get<1>(key));
    e.head_dim = std::get<2>(key);
    e.shape_class = ShapeClass::from_code(std::get<3>(key));
    e.min_work = points[k]->work;
    e.max_work = points[n - 1]->work;
    std::set<int32_t> pages, ratios;
    for (size_t i = k; i < n; ++i) {
      pages.insert(points[i]->page_size);
      ratios.insert(points[i]->num_q_heads / points[i]->num_kv_heads);
    }
    for (const CrossoverMeasurement* m : points) {
      e.max_num_seqs = std::max(e.max_num_seqs, m->num_seqs);
      e.max_query_len = std::max(e.max_query_len, m->max_query_len);
      e.max_kv_len = std::max(e.max_kv_len, m->max_kv_len);
    }
    e.page_sizes.assign(pages.begin(), pages.end());
    e.gqa_ratios.assign(ratios.begin(), ratios.end());
    e.points = static_cast<int32_t>(n);
    e.admitted_points = static_cast<int32_t>(n - k);
    out.push_back(std::move(e));
  }
  return out;
}

void CrossoverTables::add(CrossoverTable table) {
  for (CrossoverTable& t : tables_) {
    if (t.device.same_device(table.device) && t.device.cudnn_version == table.device.cudnn_version) {
      t = std::move(table);
      return;
    }
  }
  tables_.push_back(std::move(table));
}

const CrossoverTable* CrossoverTables::find(const DeviceProfile& device) const {
  for (const CrossoverTable& t : tables_) {
    if (t.device.same_device(device) && t.device.cudnn_version == device.cudnn_version) return &t;
  }
  return nullptr;
}

const CrossoverTable* CrossoverTables::find_other_version(const DeviceProfile& device) const {
  for (const CrossoverTable& t : tables_) {
    if (t.device.same_device(device) && t.device.cudnn_version != device.cudnn_version) return &t;
  }
  return nullptr;
}

CrossoverTables CrossoverTables::load(const std::vector<std::string>& paths, bool skip_missing) {
  CrossoverTables tables;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<std::string> files;
      for (const auto& entry : fs::directory_iterator(path, ec)) {
        const std::string name = entry.path().filename().string();
        if (entry.is_regular_file() && name.rfind("crossover-", 0) == 0 &&
            name.size() > 5 && name.substr(name.size() - 5) == ".json") {
          files.push_back(entry.path().string());
        }
      }
      std::sort(files.begin(), files.end());
      for (const std::string& f : files) tables.add(parse_crossover_table(read_file(f), f));
    } else if (fs::exists(path, ec)) {
      tables.add(parse_crossover_table(read_file(path), path));
    } else {
      PAGELLM_CHECK(skip_missing) << "crossover table " << path
                                  << " does not exist (expected a JSON file or a directory)";
    }
  }
  return tables;
}

std::vector<std::string> split_crossover_table_paths(const std::string& value) {
  std::vector<std::string> paths;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ':')) {
    if (!item.empty()) paths.push_back(item);
  }
  return paths;
}

std::vector<std::string> default_crossover_table_paths() {
  std::vector<std::string> paths = shipped_crossover_table_paths();
  if (const char* env = std::getenv("PAGELLM_ATTENTION_TABLES")) {
    for (std::string& p : split_crossover_table_paths(env)) paths.push_back(std::move(p));
  }
  return paths;
}

std::vector<std::string> shipped_crossover_table_paths() {
  std::vector<std::string> paths;
  // The shipped tables: data/attention in the source tree, found from the binary's folder
  // (build/, build/bench/, build/tests/<area>/) or an installed share/pagellm/attention.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    bool found = false;
    for (int up = 0; up < 4 && !found && !dir.empty(); ++up) {
      for (const fs::path& candidate :
           {dir / "data" / "attention", dir / "share" / "pagellm" / "attention"}) {
        if (!found && fs::is_directory(candidate, ec)) {
          paths.push_back(candidate.string());
          found = true;
        }
      }
      if (dir == dir.parent_path()) break;
      dir = dir.parent_path();
    }
  }
  return paths;
}

std::string crossover_file_name(const DeviceProfile& device) {
  std::string slug;
  for (char c : device.name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) {
      slug += static_cast<char>(std::tolower(u));
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  if (slug.empty()) slug = "device";
  std::ostringstream s;
  s << "crossover-" << slug << "-" << device.sm_count << "sm-cc" << device.cc_major
    << device.cc_minor << "-cudnn" << device.cudnn_version << ".json";
  return s.str();
}

}  // namespace pagellm
