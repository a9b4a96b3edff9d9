#include "graph/candidates.h"

#include "graph/builders.h"

namespace lucebox::graph {

candidate_outputs build_candidates(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * logits, uint32_t n_cand,
                                   uint32_t n_extra, bool log_norm) {
    const int64_t V = logits->ne[0], rows = logits->ne[1];
    // get_rows picks along ne1 per ne2 slice: view the logits as [1, V, rows]
    ggml_tensor * as_rows = ggml_reshape_3d(ctx, logits, 1, V, rows);
    candidate_outputs out;
    out.top_ids = named(ggml_top_k(ctx, logits, int(n_cand)), "result_top_ids");
    out.top_logits = named(ggml_get_rows(ctx, as_rows, out.top_ids), "result_top_logits");
    for (ggml_tensor * t : {out.top_ids, out.top_logits}) {
        ggml_set_output(t);
        ggml_build_forward_expand(gf, t);
    }
    if (n_extra > 0) {
        out.extra_ids = named(ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_extra, rows), "inp_extra_ids");
        ggml_set_input(out.extra_ids);
        out.extra_logits = named(ggml_get_rows(ctx, as_rows, out.extra_ids), "result_extra_logits");
        ggml_set_output(out.extra_logits);
        ggml_build_forward_expand(gf, out.extra_logits);
    }
    if (log_norm) {  // exp of (logit - max): no overflow, and the max's own term is 1
        ggml_tensor * best = ggml_reshape_2d(ctx, ggml_argmax(ctx, logits), 1, rows);             // [1, rows] I32
        out.row_max = named(ggml_get_rows(ctx, as_rows, best), "result_row_max");                  // [1, 1, rows]
        ggml_tensor * shifted = ggml_sub(ctx, logits, ggml_reshape_2d(ctx, out.row_max, 1, rows));  // [V, rows]
        out.sum_exp = named(ggml_sum_rows(ctx, ggml_exp(ctx, shifted)), "result_sum_exp");          // [1, rows]
        for (ggml_tensor * t : {out.row_max, out.sum_exp}) {
            ggml_set_output(t);
            ggml_build_forward_expand(gf, t);
        }
    }
    return out;
}

}  // namespace lucebox::graph
