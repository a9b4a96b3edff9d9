// Placement of the target over devices: device specs, validation of a placement, and the layer
// split (contiguous layer ranges, one per device, each computed by its own graph on its own backend
// with the hidden state handed across). Internal to the core; the engine owns one layer_split when
// engine_config::split is "layer", and each of its sessions one layer_split_session.
//
// Device specs: auto | cpu | cpu:N | cuda | gpu | cuda:N | gpu:N | a ggml device name (CUDA0).
// cpu:N names the N-th CPU *backend instance*: every instance computes on the host CPU in host
// memory, but is a distinct backend object with its own scheduler, so a layer split over cpu:0,
// cpu:1 really runs each range on its own backend and copies the activations between them (how the
// split is exercised on machines without GPUs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "lucebox/backend_buffers.h"
#include "lucebox/engine.h"
#include "lucebox/model_files.h"
#include "models/qwen35_model.h"

namespace lucebox {

constexpr size_t MAX_PLACEMENT_DEVICES = 16;  // GGML_BACKEND_META_MAX_DEVICES, GGML_CUDA_MAX_DEVICES

// The spec in one spelling, so duplicates are found: lower case; cpu -> cpu:0; cuda, gpu, gpu:N ->
// cuda:N; a ggml name CUDAn -> cuda:n. Throws config_error for a malformed cpu:N / cuda:N.
std::string canonical_device(const std::string & spec);

// The ggml device of a spec. Throws config_error naming the available devices when it is absent.
ggml_backend_dev_t resolve_device(const std::string & spec);
std::string available_devices();  // "CPU, CUDA0, ..."

// Sets up a CPU backend lucebox computes on: n_threads threads, and ggml's reference flash
// attention (ggml_backend_cpu_set_use_ref), whose result for a query row does not depend on how
// many rows the batch has or on the thread count; ggml's faster CPU paths do (a tiled GEMM path
// from 64 query rows on, a KV split over the threads for one row over >= 512 cache rows), which
// would make a prompt's results depend on where it is cut into micro-batches (a prefix-cache
// restore point) and a decode step round differently from a verify of the same token. The
// reference mode also turns off ggml's CPU op fusion.
void configure_cpu_backend(ggml_backend_t cpu, int n_threads);

// The checks of engine_config that concern placement (split, devices, layer_proportions,
// draft_device, and the modes a split does not support). Throws config_error. Device presence is
// checked at construction (resolve_device).
void validate_placement(const engine_config & cfg);

// Contiguous layer ranges [begin, end), one per device, sized by `proportions` (relative, one per
// device; empty: even) with cumulative rounding; every range holds >= 1 layer. Throws config_error
// when there are more devices than layers.
std::vector<std::pair<uint32_t, uint32_t>> split_layers(uint32_t n_layer, size_t n_devices,
                                                        const std::vector<float> & proportions);

struct layer_split_session;

class layer_split {
  public:
    struct shard {
        std::string spec;                    // canonical device spec
        ggml_backend_dev_t dev = nullptr;
        ggml_backend_t backend = nullptr;
        ggml_backend_sched_t sched = nullptr;      // this range's forward graphs
        ggml_backend_sched_t sched_aux = nullptr;  // commit and state-backup graphs
        uint64_t sched_graph_id = 0;               // forward graph allocated in `sched` (0: none)
        uint32_t begin = 0, end = 0;               // layers [begin, end)
        tensor_store weights;                      // this range's layers (+ embedding / head)
    };

    // Loads the target's weights over cfg.devices (cfg.split == "layer"): layer ranges from
    // cfg.layer_proportions, the token embedding on the first device, output norm + LM head on the
    // last (the embedding there too when the head is tied). `draft_dev` (null: no draft) is where
    // the draft runs: the target tensors the draft shares (embedding, head) are loaded there too
    // when no range holds them on that device.
    layer_split(const engine_config & cfg, const target_model_file & target, int n_threads,
                const std::string & draft_spec, ggml_backend_dev_t draft_dev, const progress_callback & progress);
    ~layer_split();
    layer_split(const layer_split &) = delete;
    layer_split & operator=(const layer_split &) = delete;

    const qwen35_weights & weights() const { return w_; }
    // The target weights as the draft sees them: token_embd and output on the draft's device.
    const qwen35_weights & draft_side_weights() const { return draft_w_; }
    const std::vector<shard> & shards() const { return shards_; }
    std::string device_names() const;  // "CPU+CPU", "CUDA0+CUDA1"

    // A session's state over the devices: `full` receives every layer's KV, conv/ssm state,
    // checkpoints and rings (each allocated on its range's device; full.store and full.more_stores
    // own them). The rings listed in `mirrored` (capture indices, the draft's) get a mirror on the
    // draft device (`draft_buft`, `draft_dev`), kept equal to the ring by every forward.
    std::unique_ptr<layer_split_session> new_session(qwen35_state & full, uint32_t kv_size, ggml_type type_k,
                                                     ggml_type type_v, const std::vector<int32_t> & capture,
                                                     uint32_t ring_size, uint32_t n_checkpoints,
                                                     const std::vector<size_t> & mirrored,
                                                     ggml_backend_buffer_type_t draft_buft,
                                                     ggml_backend_dev_t draft_dev) const;

    // session::run_target over the ranges: T tokens at positions [n_past, n_past + T), attention
    // over n_kv cache rows; same contract for logits, argmax and verify checkpoints.
    std::vector<float> forward(layer_split_session & ss, const int32_t * tokens, uint32_t n_past, uint32_t T,
                               uint32_t n_kv, bool all_logits, int32_t * argmax_last, bool verify,
                               std::vector<int32_t> * argmax_rows);
    // session::commit / session::backup_state: one graph per device over its layers.
    void commit(layer_split_session & ss, uint32_t n_verified, uint32_t last_kept);
    void backup(layer_split_session & ss, bool backup);

  private:
    void release();
    void compute(shard & sh, ggml_backend_sched_t s, ggml_cgraph * gf, bool alloc, const std::string & what);
    qwen35_hparams hp_;
    std::vector<shard> shards_;
    ggml_backend_t cpu_fallback_ = nullptr;  // for ops a GPU lacks (null when every device is a CPU)
    tensor_store draft_side_store_;          // embedding / head copies on the draft device
    qwen35_weights w_;
    qwen35_weights draft_w_;
    std::vector<uint8_t> graph_meta_;        // scratch for commit / backup graphs
};

// Per-session part of a layer split: per-range views of the state, cached forward graphs, and
// the ring mirrors on the draft device.
struct layer_split_session {
    struct range_graph;
    std::vector<qwen35_state> views;      // per shard: the full state with other ranges' layers null
    std::vector<std::unique_ptr<range_graph>> graphs;  // per shard
    std::vector<ggml_tensor *> mirror;    // per capture index: the ring's copy on the draft device (or null)
    tensor_store mirror_store;
    uint32_t ring_size = 0;
    std::vector<ggml_fp16_t> mask_staging;  // set_qwen35_inputs' host staging of the attention mask
    ~layer_split_session();
};

}  // namespace lucebox
