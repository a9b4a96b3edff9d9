// Snapshot data (regions in one backend buffer) and the LBXSNAP1 file format, on the CPU buffer
// type: region placement, copies between locations, save/load round trips and malformed files.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "check.h"
#include "lucebox/errors.h"
#include "state/snapshot.h"

using namespace lucebox;

namespace {
std::string tmp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() / ("lucebox_test_snapshot_" + name)).string();
}

// Fills region i with bytes (i * 31 + j) & 0xff.
void fill(const snapshot_data & d) {
    for (size_t i = 0; i < d.n_regions(); ++i) {
        if (ggml_tensor * r = d.region(i)) {
            std::vector<uint8_t> bytes(d.sizes()[i]);
            for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = uint8_t((i * 31 + j) & 0xff);
            ggml_backend_tensor_set(r, bytes.data(), 0, bytes.size());
        }
    }
}

bool same_bytes(const snapshot_data & a, const snapshot_data & b) {
    if (a.sizes() != b.sizes()) return false;
    for (size_t i = 0; i < a.n_regions(); ++i) {
        if (a.region(i) == nullptr) {
            if (b.region(i) != nullptr) return false;
            continue;
        }
        std::vector<uint8_t> x(a.sizes()[i]), y(a.sizes()[i]);
        ggml_backend_tensor_get(a.region(i), x.data(), 0, x.size());
        ggml_backend_tensor_get(b.region(i), y.data(), 0, y.size());
        if (x != y) return false;
    }
    return true;
}

const std::vector<uint64_t> SIZES = {0, 10, 1000, 0, 7, 4096};

session_snapshot make_snapshot(snapshot_location where) {
    session_snapshot s;
    s.fingerprint = "test layout";
    s.tokens = {1, 2, 3, 40000};
    s.pending = 17;
    auto d = std::make_shared<snapshot_data>(SIZES, snapshot_buffer_type(nullptr, where), where);
    fill(*d);
    s.data = d;
    return s;
}
}  // namespace

TEST_CASE(locations_parse_and_name) {
    CHECK(parse_snapshot_location("host") == snapshot_location::host);
    CHECK(parse_snapshot_location("device") == snapshot_location::device);
    CHECK(std::string(snapshot_location_name(snapshot_location::device)) == "device");
    CHECK_THROWS(parse_snapshot_location("gpu"), config_error, "must be host or device");
    CHECK_THROWS(parse_snapshot_location(""), config_error, "must be host or device");
    CHECK(snapshot_buffer_type(nullptr, snapshot_location::host) == ggml_backend_cpu_buffer_type());
}

TEST_CASE(regions_are_placed_aligned_and_empty_ones_are_null) {
    snapshot_data d(SIZES, ggml_backend_cpu_buffer_type(), snapshot_location::host);
    CHECK(d.n_regions() == SIZES.size());
    CHECK(d.total() == 10 + 1000 + 7 + 4096);
    CHECK(d.is_host() && d.location() == snapshot_location::host);
    const size_t align = ggml_backend_buft_get_alignment(ggml_backend_cpu_buffer_type());
    for (size_t i = 0; i < SIZES.size(); ++i) {
        CHECK((d.region(i) == nullptr) == (SIZES[i] == 0));
        if (d.region(i) != nullptr) {
            CHECK(ggml_nbytes(d.region(i)) == SIZES[i]);
            CHECK(reinterpret_cast<uintptr_t>(d.region(i)->data) % align == 0);
        }
    }
    fill(d);  // regions do not overlap: each keeps its own pattern
    CHECK(static_cast<uint8_t *>(d.region(2)->data)[999] == uint8_t((2 * 31 + 999) & 0xff));
    CHECK(static_cast<uint8_t *>(d.region(1)->data)[9] == uint8_t(31 + 9));
    snapshot_data none({}, ggml_backend_cpu_buffer_type(), snapshot_location::host);
    CHECK(none.total() == 0 && none.n_regions() == 0);
}

TEST_CASE(copies_between_locations_keep_the_bytes) {
    const session_snapshot dev = make_snapshot(snapshot_location::device);
    CHECK(dev.location() == snapshot_location::device);
    CHECK(dev.bytes() == 4 * sizeof(int32_t) + 10 + 1000 + 7 + 4096);
    const session_snapshot host = dev.to_host();
    CHECK(host.location() == snapshot_location::host);
    CHECK(host.data != dev.data && same_bytes(*host.data, *dev.data));
    CHECK(host.to_host().data == host.data);  // already host: shared, not copied
    auto back = copy_snapshot_data(*host.data, ggml_backend_cpu_buffer_type(), snapshot_location::device);
    CHECK(back->location() == snapshot_location::device && same_bytes(*back, *dev.data));
}

TEST_CASE(save_and_load_round_trip_from_either_location) {
    for (snapshot_location where : {snapshot_location::host, snapshot_location::device}) {
        const session_snapshot s = make_snapshot(where);
        const std::string path = tmp_path(snapshot_location_name(where));
        s.save(path);
        const session_snapshot l = session_snapshot::load(path);
        CHECK(l.location() == snapshot_location::host);
        CHECK(l.fingerprint == s.fingerprint && l.tokens == s.tokens && l.pending == s.pending);
        CHECK(l.region_sizes() == SIZES && l.bytes() == s.bytes());
        CHECK(same_bytes(*l.data, *s.data));
        const session_snapshot d = load_snapshot_file(path, ggml_backend_cpu_buffer_type(), snapshot_location::device);
        CHECK(d.location() == snapshot_location::device && same_bytes(*d.data, *s.data));
        std::remove(path.c_str());
    }
}

TEST_CASE(malformed_files_are_refused) {
    const std::string path = tmp_path("good");
    make_snapshot(snapshot_location::host).save(path);
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto write = [](const std::string & p, const std::string & data) {
        std::ofstream(p, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
    };
    const std::string cut = tmp_path("cut"), extra = tmp_path("extra"), junk = tmp_path("junk");
    write(cut, bytes.substr(0, bytes.size() - 100));
    write(extra, bytes + "xx");
    write(junk, "definitely not a snapshot");
    CHECK_THROWS(session_snapshot::load(cut), config_error, "truncated or corrupt");
    CHECK_THROWS(session_snapshot::load(extra), config_error, "unexpected trailing bytes");
    CHECK_THROWS(session_snapshot::load(junk), config_error, "not a lucebox snapshot");
    CHECK_THROWS(session_snapshot::load(tmp_path("missing")), config_error, "cannot open snapshot");
    for (const std::string & p : {path, cut, extra, junk}) std::remove(p.c_str());
}

TEST_MAIN()
