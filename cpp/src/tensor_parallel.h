// Tensor-parallel placement (engine_config::split == "tensor"): every layer's heads and FFN
// channels are divided over the devices through one ggml meta device
// (ggml_backend_meta_device). Weights and session state live in meta buffers (one slice per
// device, or a full copy where mirrored); the target graph is the same graph as on one device,
// computed by the meta backend, which runs each device's slice and all-reduces the partial sums
// of the row-split output projections (attn_output, ssm_out, ffn_down). Internal to the core;
// the engine owns one tensor_split when the split is "tensor".
//
// How each tensor is split (the callback the meta device asks for statically allocated tensors;
// see tensor_split_plan::state_of and docs/multi-gpu.md):
//   attention   attn_q (q+gate per head) / attn_k / attn_v on the output axis in whole KV-head
//               groups; attn_output on the input axis (partial sums); cache_k / cache_v on the
//               head axis (axis 0 of [Hkv*hd, kv_size]).
//   DeltaNet    whole K heads per device, each with its Hv/Hk V heads (tiled V order: V head h
//               uses K head h % Hk, so V heads come in Hv/Hk blocks of Hk). attn_qkv, ssm_conv1d,
//               the conv state and its verify checkpoint: 2 + Hv/Hk repeats of a K-head slice
//               (q, k, then each V block); attn_gate, ssm_out (input axis), ssm_alpha, ssm_beta,
//               ssm_dt, ssm_a, the ssm state and its checkpoints: Hv/Hk repeats.
//   FFN         ffn_gate / ffn_up on the output axis, ffn_down on the input axis.
//   mirrored    token embedding, LM head, every norm, the feature rings.
// Heads (and FFN blocks) are dealt as evenly as the device count allows; a device may get one
// unit more than another. Every device must get at least one unit of each, and a row-split
// (input-axis) slice must hold whole quantization blocks: otherwise construction throws
// config_error naming the tensor and the sizes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "lucebox/backend_buffers.h"
#include "lucebox/engine.h"
#include "lucebox/model_files.h"
#include "models/qwen35_model.h"

namespace lucebox {

// The split of one model over n devices, by tensor name. Units are dealt so that device j gets
// `k_heads[j]` DeltaNet K heads, `kv_heads[j]` attention KV heads (with their query heads) and
// `ff_blocks[j] * ff_block` FFN channels.
struct tensor_split_plan {
    qwen35_hparams hp;
    size_t n = 0;                    // devices
    std::vector<int64_t> k_heads;    // per device (empty without DeltaNet layers)
    std::vector<int64_t> kv_heads;   // per device (empty without attention layers)
    std::vector<int64_t> ff_blocks;  // per device
    int64_t ff_block = 1;            // FFN channels per unit (the ffn_down quantization block)

    // Deals the units and checks every slice (throws config_error). `type_of(name)` is the ggml
    // type of a weight of the file; type_k / type_v the KV cache types.
    static tensor_split_plan make(const qwen35_hparams & hp, size_t n_devices,
                                  const std::function<ggml_type(const std::string &)> & type_of, ggml_type type_k,
                                  ggml_type type_v);

    // The split state of a weight or state tensor, by name (the names qwen35_tensor_specs and
    // qwen35_state::allocate give). Unknown names are mirrored.
    ggml_backend_meta_split_state state_of(const std::string & name) const;
};

class tensor_split {
  public:
    // Loads the target's weights over cfg.devices (cfg.split == "tensor") into meta buffers.
    // `draft_dev` (null: no draft) is where the draft runs: the target tensors it shares
    // (embedding, LM head) are loaded there too as plain tensors.
    tensor_split(const engine_config & cfg, const target_model_file & target, ggml_type type_k, ggml_type type_v,
                 int n_threads, ggml_backend_dev_t draft_dev, const progress_callback & progress);
    ~tensor_split();
    tensor_split(const tensor_split &) = delete;
    tensor_split & operator=(const tensor_split &) = delete;

    const qwen35_weights & weights() const { return w_; }
    // The target weights as the draft sees them: token_embd and output on the draft's device.
    const qwen35_weights & draft_side_weights() const { return draft_w_; }
    const tensor_split_plan & plan() const { return *plan_; }
    ggml_backend_dev_t device() const { return meta_dev_; }  // the meta device
    ggml_backend_buffer_type_t buffer_type() const { return ggml_backend_dev_buffer_type(meta_dev_); }
    ggml_backend_sched_t sched() const { return sched_; }          // target forward graphs
    ggml_backend_sched_t sched_aux() const { return sched_aux_; }  // commit and state-backup graphs
    std::string device_names() const;  // "Meta(CPU,CPU)", "Meta(CUDA0,CUDA1)"
    // Assigns every node and leaf of `gf` to the meta backend in `s` (one of the two schedulers,
    // after its reset, before allocation). Needed because a meta buffer over CPU devices reports
    // host memory, so the scheduler would otherwise hand ops to its plain CPU backend, which
    // cannot read a meta tensor.
    void assign(ggml_backend_sched_t s, ggml_cgraph * gf) const;

  private:
    void release();
    std::unique_ptr<tensor_split_plan> plan_;  // the meta device's callback data (stable address)
    ggml_backend_dev_t meta_dev_ = nullptr;
    ggml_backend_t meta_ = nullptr;
    ggml_backend_t cpu_ = nullptr;  // the scheduler's last backend must be a CPU one
    ggml_backend_sched_t sched_ = nullptr;
    ggml_backend_sched_t sched_aux_ = nullptr;
    tensor_store weights_;
    tensor_store draft_side_store_;
    qwen35_weights w_;
    qwen35_weights draft_w_;
    std::string names_;
};

}  // namespace lucebox
