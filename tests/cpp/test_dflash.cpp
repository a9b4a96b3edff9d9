// DFlash draft pieces that need no file: the proposal block's attention masks for both SWA kinds,
// the original lucebox default of the captured target layers, and schema-dependent tensor names.
#include <cmath>
#include <string>

#include "check.h"
#include "lucebox/errors.h"
#include "lucebox/models.h"
#include "models/dflash_model.h"

using namespace lucebox;

namespace {

dflash_hparams draft(dflash_schema schema, uint32_t n_swa) {
    dflash_hparams hp;
    hp.set_schema(schema);
    hp.n_embd = 128; hp.n_layer = 2; hp.n_ff = 256; hp.n_head = 4; hp.n_head_kv = 2; hp.head_dim = 64;
    hp.n_rot = 64; hp.block_size = 4; hp.target_layers = {1, 3};
    hp.n_swa = n_swa;
    if (n_swa > 0) {
        hp.is_swa = {true, false};
    }
    hp.validate();
    return hp;
}

// One mask row as a string: '.' visible (0), 'x' masked (-inf).
std::string row(const std::vector<ggml_fp16_t> & mask, uint32_t n_kv, uint32_t i) {
    std::string s;
    for (uint32_t k = 0; k < n_kv; ++k) {
        const float v = ggml_fp16_to_fp32(mask[size_t(i) * n_kv + k]);
        s += v == 0.0f ? '.' : (std::isinf(v) && v < 0 ? 'x' : '?');
    }
    return s;
}

std::vector<ggml_fp16_t> block_mask(const dflash_hparams & hp, bool swa, uint32_t n_past, uint32_t block,
                                    uint32_t n_kv) {
    std::vector<ggml_fp16_t> m;
    dflash_block_mask(hp, swa, n_past, block, n_kv, m);
    return m;
}

}  // namespace

TEST_CASE(full_layers_see_everything_bidirectional) {
    for (dflash_schema s : {dflash_schema::upstream, dflash_schema::lucebox}) {
        const dflash_hparams hp = draft(s, 2);
        const auto m = block_mask(hp, false, 5, 3, 10);  // 5 context rows, block of 3, 2 padding
        for (uint32_t i = 0; i < 3; ++i) {
            CHECK(row(m, 10, i) == "........xx");
        }
    }
}

TEST_CASE(upstream_causal_flag) {
    dflash_hparams hp = draft(dflash_schema::upstream, 0);
    hp.causal = true;
    const auto m = block_mask(hp, false, 5, 3, 10);
    CHECK(row(m, 10, 0) == "......xxxx");
    CHECK(row(m, 10, 1) == ".......xxx");
    CHECK(row(m, 10, 2) == "........xx");
}

TEST_CASE(upstream_swa_is_per_query_and_bidirectional) {
    // key k visible to the block row at q when q - k < n_swa (block rows too)
    const dflash_hparams hp = draft(dflash_schema::upstream, 3);
    CHECK(hp.swa_kind == dflash_swa_kind::per_query);
    const auto m = block_mask(hp, true, 5, 3, 10);
    CHECK(row(m, 10, 0) == "xxx.....xx");  // q = 5: context 3, 4
    CHECK(row(m, 10, 1) == "xxxx....xx");  // q = 6: context 4
    CHECK(row(m, 10, 2) == "xxxxx...xx");  // q = 7: no context
    // a block longer than the window: the rows before the window are hidden in the block too
    const auto b = block_mask(draft(dflash_schema::upstream, 2), true, 5, 4, 10);
    CHECK(row(b, 10, 0) == "xxxx.....x");  // q = 5: context 4, the block
    CHECK(row(b, 10, 1) == "xxxxx....x");  // q = 6: block rows 5..8
    CHECK(row(b, 10, 2) == "xxxxxx...x");  // q = 7: block rows 6..8
    CHECK(row(b, 10, 3) == "xxxxxxx..x");  // q = 8: block rows 7, 8
}

TEST_CASE(lucebox_swa_is_last_context_and_causal) {
    // every block row sees the last n_swa context rows; the block is causal
    const dflash_hparams hp = draft(dflash_schema::lucebox, 3);
    CHECK(hp.swa_kind == dflash_swa_kind::last_context);
    const auto m = block_mask(hp, true, 5, 3, 10);
    CHECK(row(m, 10, 0) == "xx....xxxx");
    CHECK(row(m, 10, 1) == "xx.....xxx");
    CHECK(row(m, 10, 2) == "xx......xx");
    // a window wider than the context: the whole context, still causal in the block
    const auto w = block_mask(draft(dflash_schema::lucebox, 100), true, 5, 3, 10);
    CHECK(row(w, 10, 0) == "......xxxx");
    CHECK(row(w, 10, 2) == "........xx");
}

TEST_CASE(default_target_layers) {
    // the original: output ids 1 + k * (n_layer - 2) / (N - 1); ours are inputs (+1)
    CHECK((dflash_default_target_layers(5, 64) == std::vector<int32_t>{2, 17, 32, 47, 62}));  // 27B: 1,16,31,46,61
    CHECK((dflash_default_target_layers(5, 32) == std::vector<int32_t>{2, 9, 16, 23, 30}));   // 9B: 1,8,15,22,29
    CHECK((dflash_default_target_layers(2, 4) == std::vector<int32_t>{2, 4}));                // the last layer's output
    CHECK((dflash_default_target_layers(1, 4) == std::vector<int32_t>{2}));
    CHECK_THROWS(dflash_default_target_layers(5, 4), draft_mismatch_error, "cannot derive 5 distinct captured layers");
    CHECK_THROWS(dflash_default_target_layers(1, 1), draft_mismatch_error, "from a target with 1 layers");
}

TEST_CASE(schema_names_and_deferred_ids) {
    dflash_hparams hp = draft(dflash_schema::lucebox, 0);
    const auto specs = dflash_tensor_specs(hp);
    CHECK(specs[0].name == "dflash.fc.weight" && specs[0].ne[0] == 2 * 128);
    CHECK(specs[1].name == "dflash.hidden_norm.weight");
    hp.target_layers.clear();
    hp.n_deferred_target_layers = 3;  // ids to come from the target
    hp.validate();
    CHECK(hp.n_target_layers() == 3 && dflash_tensor_specs(hp)[0].ne[0] == 3 * 128);
    hp.target_layers = {1};
    CHECK_THROWS(hp.validate(), config_error, "exclusive");
    hp.set_schema(dflash_schema::upstream);
    CHECK(hp.names.fc == "fc.weight" && hp.swa_kind == dflash_swa_kind::per_query);
    dflash_hparams own = draft(dflash_schema::lucebox, 0);
    own.has_output = true;
    CHECK_THROWS(own.validate(), config_error, "no embedding or LM head");
}

TEST_CASE(a_kept_mask_vector_is_overwritten_whole) {
    // the engine keeps one vector from step to step: a longer, stale mask in it leaves nothing behind
    const dflash_hparams hp = draft(dflash_schema::lucebox, 3);
    std::vector<ggml_fp16_t> m(64, ggml_fp32_to_fp16(0.0f));
    dflash_block_mask(hp, false, 2, 3, 8, m);
    CHECK(m.size() == 24u);
    CHECK(m == block_mask(hp, false, 2, 3, 8));
    dflash_block_mask(hp, true, 5, 3, 10, m);  // longer again, the SWA mask
    CHECK(m == block_mask(hp, true, 5, 3, 10));
    CHECK(row(m, 10, 0) == "xx....xxxx");
}

TEST_MAIN()
