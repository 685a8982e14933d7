/* ff_cost.c — FLOPs, memory and time of the pieces of a plan; formulas and sources in
 * docs/cost-model.md. Pure functions of their arguments: the planner calls them millions of
 * times, so nothing here allocates. */
#include "ff_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const ff_mem_item_names[FF_MEM_COUNT] = {
    "weights", "gradients", "master_weights", "optimizer", "activations", "logits", "reserve"};

/* ---- FLOPs ------------------------------------------------------------------------------ */

double ff_flops_layer_matmul_params(const ff_model *m) {
  double h = (double)m->hidden, head_dim = (double)(m->hidden / m->heads);
  double attention = 2.0 * h * h + 2.0 * h * (double)m->kv_heads * head_dim; /* q, o; k, v */
  double mlp = 3.0 * h * (double)m->ffn_hidden;                                /* gate, up, down */
  return attention + mlp;
}

double ff_flops_layer_forward(const ff_model *m, double b) {
  double s = (double)m->seq_len, h = (double)m->hidden;
  return 2.0 * b * s * ff_flops_layer_matmul_params(m) + 4.0 * b * s * s * h;
}

double ff_flops_layer_recompute(const ff_model *m, double b, ff_recompute rc) {
  double s = (double)m->seq_len, h = (double)m->hidden;
  switch (rc) {
  case FF_RECOMPUTE_SELECTIVE: return 4.0 * b * s * s * h;
  case FF_RECOMPUTE_FULL: return ff_flops_layer_forward(m, b);
  default: return 0.0;
  }
}

double ff_flops_head_forward(const ff_model *m, double b) {
  return 2.0 * b * (double)m->seq_len * (double)m->hidden * (double)m->vocab;
}

double ff_flops_model_per_token(const ff_model *m) {
  double n = (double)m->layers * ff_flops_layer_matmul_params(m) +
             (double)m->vocab * (double)m->hidden;
  return 6.0 * n + 12.0 * (double)m->layers * (double)m->hidden * (double)m->seq_len;
}

double ff_flops_gpt_per_sequence(double s, double l, double h, double V) {
  return 72.0 * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

double ff_flops_gpt_selective_hardware_per_sequence(double s, double l, double h, double V) {
  return 72.0 * s * l * h * h * (1.0 + s / (3.0 * h) + V / (12.0 * l * h));
}

double ff_mem_interleave_factor(int p, int v) {
  return v > 1 ? 1.0 + (double)(p - 1) / ((double)p * (double)v) : 1.0;
}

/* ---- memory ----------------------------------------------------------------------------- */

double ff_mem_activation_layer_bytes(double s, double b, double h, double a, double t,
                                     bool sequence_parallel, ff_recompute rc) {
  double sbh = s * b * h;
  switch (rc) {
  case FF_RECOMPUTE_FULL: return sequence_parallel ? 2.0 * sbh / t : 2.0 * sbh;
  case FF_RECOMPUTE_SELECTIVE: return sequence_parallel ? sbh * 34.0 / t : sbh * (10.0 + 24.0 / t);
  default:
    if (sequence_parallel)
      return sbh * (34.0 / t + 5.0 * a * s / (h * t));
    return sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
  }
}

double ff_mem_bytes_per_param(ff_precision p, bool zero1, int dp) {
  double d = zero1 && dp > 1 ? (double)dp : 1.0;
  if (p == FF_PRECISION_BF16)
    return 2.0 + 4.0 + (4.0 + 8.0) / d; /* bf16 weights, fp32 grads; master and moments */
  return 4.0 + 4.0 + 8.0 / d;           /* fp32 weights and grads; moments */
}

/* Per token of a layer: values the backward reads and fp32 row statistics (executor/model.c's
 * layer_acts_floats, less the statistics). */
static double layer_values(const ff_model *m, ff_shard sh) {
  double h = (double)m->hidden, d = (double)(m->hidden / m->heads);
  return 4.0 * h + 2.0 * sh.heads * d + 2.0 * sh.kv_heads * d + 3.0 * sh.ffn;
}

static double layer_stats(ff_shard sh) { return 2.0 + sh.heads; }

double ff_mem_layer_kept_bytes(const ff_model *m, ff_shard sh, double b, ff_precision prec,
                               ff_recompute rc) {
  double n = b * (double)m->seq_len, e = prec == FF_PRECISION_BF16 ? 2.0 : 4.0;
  if (rc == FF_RECOMPUTE_FULL)
    return n * (double)m->hidden * e;
  return n * (layer_values(m, sh) * e + layer_stats(sh) * 4.0);
}

double ff_mem_stage_buffer_bytes(const ff_model *m, ff_shard sh, double b, ff_precision prec,
                                 ff_recompute rc, bool has_layers, double in_flight) {
  double n = b * (double)m->seq_len, h = (double)m->hidden, d = (double)(m->hidden / m->heads);
  bool bf16 = prec == FF_PRECISION_BF16 && has_layers, full = rc == FF_RECOMPUTE_FULL && has_layers;
  double floats = 0.0, halves = 0.0;
  double q = sh.heads * d, k = sh.kv_heads * d;
  if (bf16) /* the fp32 part of a bf16 layer (x_in, x_mid; q, k, v, att) and its output */
    floats += n * (3.0 * h + 2.0 * q + 2.0 * k);
  else if (full) /* the whole layer, statistics of its own and no x_in (each layer keeps its own) */
    floats += n * (layer_values(m, sh) + layer_stats(sh));
  if (bf16 && full) { /* the set every layer but its x_in shares */
    halves += n * (layer_values(m, sh) - h);
    floats += n * layer_stats(sh);
  }
  floats += in_flight * n * (2.0 * h + 1.0); /* output, its gradient, tokens */
  floats += n * (h + 5.0);                   /* final norm rows, its 1/rms, softmax rows, targets */
  double wide = sh.ffn > q ? sh.ffn : q;
  double a = h;
  if (3.0 * wide > a)
    a = 3.0 * wide;
  if (2.0 * q + 2.0 * k > a)
    a = 2.0 * q + 2.0 * k;
  floats += n * (a + 2.0 * h); /* the backward's temporaries */
  if (bf16) {                  /* the widest matmul output gradient, rounded to bf16 */
    double widest = h > sh.ffn ? h : sh.ffn;
    widest = q > widest ? q : widest;
    halves += n * (k > widest ? k : widest);
  }
  return floats * 4.0 + halves * 2.0;
}

double ff_mem_logits_bytes(const ff_model *m, ff_shard sh, double b, ff_precision prec) {
  double n = b * (double)m->seq_len, bytes = 4.0 * n * sh.vocab;
  if (prec == FF_PRECISION_BF16) /* the bf16 operands: final norm rows, the logits' gradient */
    bytes += 2.0 * n * ((double)m->hidden + sh.vocab);
  return bytes;
}

/* ---- time ------------------------------------------------------------------------------- */

double ff_peak_flops(const ff_device *dev, ff_precision prec) {
  double tflops;
  if (prec == FF_PRECISION_BF16)
    tflops = dev->peak_tflops[FF_DTYPE_BF16] > 0 ? dev->peak_tflops[FF_DTYPE_BF16]
                                                 : dev->peak_tflops[FF_DTYPE_FP16];
  else
    tflops = dev->peak_tflops[FF_DTYPE_FP32];
  return tflops * 1e12;
}

/* GEMM efficiency (achieved / dense peak, at most 1) for C(m×n) = A(m×k)·B(k×n) from the
 * device's measured.gemm entries of the training dtype (bf16 training: bf16 entries, else fp16
 * ones, as the peak falls back; fp32: fp32): an entry of exactly this shape if there is one;
 * else, against the geometric mean size g = (m·n·k)^(1/3), linear in ln g between the nearest
 * entries below and above (the first listed on a tie), and the end entry's value beyond the
 * ends. Without entries, FF_COST_GEMM_EFFICIENCY. */
static double gemm_efficiency(const ff_device *dev, ff_precision prec, double m, double n,
                              double k) {
  /* neighbours by volume m·n·k (the same order as ln g), for the wanted dtype and, for bf16
   * training, for fp16 too (used when no bf16 entry exists); logarithms only for the two found */
  ff_dtype want = prec == FF_PRECISION_BF16 ? FF_DTYPE_BF16 : FF_DTYPE_FP32;
  double peak = ff_peak_flops(dev, prec), v = m * n * k;
  const ff_gemm_measure *near[2][2] = {{NULL, NULL}, {NULL, NULL}}; /* [alternative][lo, hi] */
  double v_near[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
  bool exact[2] = {false, false};
  for (int i = 0; i < dev->n_gemm; i++) {
    const ff_gemm_measure *g = &dev->gemm[i];
    int a = g->dtype == want ? 0 : want == FF_DTYPE_BF16 && g->dtype == FF_DTYPE_FP16 ? 1 : -1;
    if (a < 0 || exact[a])
      continue;
    if ((double)g->m == m && (double)g->n == n && (double)g->k == k) {
      near[a][0] = near[a][1] = g;
      exact[a] = true;
      continue;
    }
    double x = (double)g->m * (double)g->n * (double)g->k;
    if (x <= v && (!near[a][0] || x > v_near[a][0]))
      near[a][0] = g, v_near[a][0] = x;
    if (x >= v && (!near[a][1] || x < v_near[a][1]))
      near[a][1] = g, v_near[a][1] = x;
  }
  int a = near[0][0] || near[0][1] ? 0 : 1;
  const ff_gemm_measure *lo = near[a][0], *hi = near[a][1];
  double v_lo = v_near[a][0], v_hi = v_near[a][1];
  double eff;
  if (!lo && !hi)
    eff = FF_COST_GEMM_EFFICIENCY;
  else if (!lo || !hi || lo == hi || v_hi <= v_lo)
    eff = (lo ? lo : hi)->tflops * 1e12 / peak;
  else {
    double e_lo = lo->tflops * 1e12 / peak, e_hi = hi->tflops * 1e12 / peak;
    eff = e_lo + (e_hi - e_lo) * log(v / v_lo) / log(v_hi / v_lo);
  }
  return eff > 1.0 ? 1.0 : eff;
}

double ff_time_gemm(const ff_device *dev, ff_precision prec, double m, double n, double k) {
  if (m <= 0 || n <= 0 || k <= 0)
    return 0.0;
  double flops = 2.0 * m * n * k;
  double elem = prec == FF_PRECISION_BF16 ? 2.0 : 4.0;
  double compute = flops / (ff_peak_flops(dev, prec) * gemm_efficiency(dev, prec, m, n, k));
  double traffic = ff_time_memory(dev, elem * (m * k + k * n + m * n));
  return compute > traffic ? compute : traffic;
}

/* Streaming kernels run at the device's measured bandwidth (at most the datasheet's), or at
 * FF_COST_MEMORY_EFFICIENCY of the datasheet without a measurement. */
double ff_time_memory(const ff_device *dev, double bytes) {
  double bw = dev->memory_bandwidth_gb_per_s * FF_COST_MEMORY_EFFICIENCY;
  if (dev->measured_memory_gb_per_s > 0)
    bw = dev->measured_memory_gb_per_s < dev->memory_bandwidth_gb_per_s
             ? dev->measured_memory_gb_per_s
             : dev->memory_bandwidth_gb_per_s;
  return bytes / (bw * 1e9);
}

/* ---- communication ---------------------------------------------------------------------- */

double ff_comm_p2p(double bytes, ff_link link) {
  return link.latency_us * 1e-6 + bytes / (link.bandwidth_gb_per_s * 1e9);
}

double ff_comm_allreduce_ring(int n, double bytes, ff_link link) {
  if (n <= 1)
    return 0.0;
  double steps = 2.0 * (n - 1);
  return steps * link.latency_us * 1e-6 + steps / n * bytes / (link.bandwidth_gb_per_s * 1e9);
}

ff_link ff_cluster_gpu_link(const ff_cluster *c, int node_a, int gpu_a, int node_b, int gpu_b) {
  if (node_a != node_b)
    return ff_cluster_node_link(c, node_a, node_b);
  const ff_node *n = &c->nodes[node_a];
  if (gpu_a / n->island_gpus == gpu_b / n->island_gpus && n->island_gpus > 1)
    return n->island;
  if (n->island_gpus < n->gpus)
    return n->intra;
  return n->island;
}

static ff_link slower(ff_link a, ff_link b) {
  if (a.bandwidth_gb_per_s != b.bandwidth_gb_per_s)
    return a.bandwidth_gb_per_s < b.bandwidth_gb_per_s ? a : b;
  return a.latency_us > b.latency_us ? a : b;
}

typedef struct member {
  int node, gpu, index;
} member;

static int cmp_member(const void *a, const void *b) {
  const member *x = a, *y = b;
  if (x->node != y->node)
    return x->node < y->node ? -1 : 1;
  return x->index < y->index ? -1 : (x->index > y->index);
}

static int cmp_first_index(const void *a, const void *b) {
  const member *x = a, *y = b;
  return x->index < y->index ? -1 : (x->index > y->index);
}

ff_link ff_cluster_shared_link(const ff_cluster *c, ff_link link, int node_a, int node_b,
                               int flows_a, int flows_b) {
  const int ends[2] = {node_a, node_b}, flows[2] = {flows_a, flows_b};
  double bw = link.bandwidth_gb_per_s;
  for (int e = 0; e < 2; e++) {
    const ff_node *x = &c->nodes[ends[e]];
    double nic = x->nic_bandwidth_gb_per_s > 0 ? x->nic_bandwidth_gb_per_s
                                               : link.bandwidth_gb_per_s;
    double share = (x->nics > 0 ? x->nics : 1) * nic / (flows[e] > 1 ? flows[e] : 1);
    if (share < bw)
      bw = share;
  }
  link.bandwidth_gb_per_s = bw;
  return link;
}

/* The link between members a and b of a collective: shared at the NICs when they are on
 * different nodes and flows are given. */
static ff_link member_link(const ff_cluster *c, int node_a, int gpu_a, int node_b, int gpu_b,
                           const int *flows) {
  ff_link l = ff_cluster_gpu_link(c, node_a, gpu_a, node_b, gpu_b);
  if (flows && node_a != node_b)
    l = ff_cluster_shared_link(c, l, node_a, node_b, flows[node_a], flows[node_b]);
  return l;
}

int ff_boundary_flows(int n_a, int n_b) {
  int x = n_a, y = n_b;
  while (y > 0) {
    int r = x % y;
    x = y, y = r;
  }
  return n_a + n_b - x;
}

double ff_comm_boundary(double bytes, int n_a, int n_b, bool cross, ff_link link) {
  int wide = n_a > n_b ? n_a : n_b, narrow = n_a < n_b ? n_a : n_b;
  return ff_comm_p2p(bytes / (cross ? wide : narrow), link);
}

static double gather_ring(int n, ff_link ring, double bytes) {
  return n * ring.latency_us * 1e-6 + bytes / (ring.bandwidth_gb_per_s * 1e9);
}

/* The slowest link of the flat ring over members (node[i], gpu[i]) in the given order. */
static ff_link flat_ring(const ff_cluster *c, int n, const int *node, const int *gpu,
                         const int *flows) {
  ff_link ring = member_link(c, node[n - 1], gpu[n - 1], node[0], gpu[0], flows);
  for (int i = 1; i < n; i++)
    ring = slower(ring, member_link(c, node[i - 1], gpu[i - 1], node[i], gpu[i], flows));
  return ring;
}

double ff_comm_gather(const ff_cluster *c, int n, const int *node, const int *gpu, double bytes) {
  return n <= 1 ? 0.0 : gather_ring(n, flat_ring(c, n, node, gpu, NULL), bytes);
}

double ff_comm_gather_node(const ff_cluster *c, int node, int first_gpu, int n, double bytes) {
  if (n <= 1)
    return 0.0;
  ff_link ring = ff_cluster_gpu_link(c, node, first_gpu + n - 1, node, first_gpu);
  for (int i = 1; i < n; i++)
    ring = slower(ring, ff_cluster_gpu_link(c, node, first_gpu + i - 1, node, first_gpu + i));
  return gather_ring(n, ring, bytes);
}

double ff_comm_allreduce(const ff_cluster *c, int n, const int *node, const int *gpu,
                         double bytes) {
  return ff_comm_allreduce_shared(c, n, node, gpu, bytes, NULL);
}

double ff_comm_allreduce_shared(const ff_cluster *c, int n, const int *node, const int *gpu,
                                double bytes, const int *flows) {
  if (n <= 1)
    return 0.0;
  double flat = ff_comm_allreduce_ring(n, bytes, flat_ring(c, n, node, gpu, flows));
  bool one_node = true;
  for (int i = 1; i < n && one_node; i++)
    one_node = node[i] == node[0];
  if (one_node) /* a TP group, or DP peers striped onto one node: nothing to arrange */
    return flat;
  /* Hierarchical: members grouped by node (sorted, O(n log n)); the first member of each node is
   * its leader, and leaders in order of appearance form the inter-node ring. */
  member small[2 * 64];
  member *m = n <= 64 ? small : malloc(2 * (size_t)n * sizeof *m);
  if (!m)
    return flat;
  member *leaders = m + n;
  for (int i = 0; i < n; i++)
    m[i] = (member){node[i], gpu[i], i};
  qsort(m, (size_t)n, sizeof *m, cmp_member);
  int nodes = 0, largest = 0;
  ff_link intra = {INFINITY, 0}, inter = {INFINITY, 0};
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && m[j].node == m[i].node)
      j++;
    for (int k = i + 1; k < j; k++) /* ring inside the node, in gpu order of appearance */
      intra = slower(intra, ff_cluster_gpu_link(c, m[k - 1].node, m[k - 1].gpu, m[k].node, m[k].gpu));
    if (j - i > 1)
      intra = slower(intra, ff_cluster_gpu_link(c, m[j - 1].node, m[j - 1].gpu, m[i].node, m[i].gpu));
    if (j - i > largest)
      largest = j - i;
    leaders[nodes++] = m[i];
    i = j;
  }
  qsort(leaders, (size_t)nodes, sizeof *leaders, cmp_first_index);
  for (int k = 1; k < nodes; k++)
    inter = slower(inter, member_link(c, leaders[k - 1].node, leaders[k - 1].gpu,
                                      leaders[k].node, leaders[k].gpu, flows));
  if (nodes > 2)
    inter = slower(inter, member_link(c, leaders[nodes - 1].node, leaders[nodes - 1].gpu,
                                      leaders[0].node, leaders[0].gpu, flows));
  if (m != small)
    free(m);
  if (nodes <= 1 || largest <= 1)
    return flat;
  double local = ff_comm_allreduce_ring(largest, bytes, intra); /* reduce-scatter + all-gather */
  double across = ff_comm_allreduce_ring(nodes, bytes / largest, inter);
  double hier = local + across;
  return hier < flat ? hier : flat;
}

/* ---- one layer of one rank's shard ------------------------------------------------------- */

double ff_cost_layer_params(const ff_model *m, ff_shard sh) {
  double h = (double)m->hidden, hd = (double)(m->hidden / m->heads);
  return 2.0 * h * sh.heads * hd + 2.0 * h * sh.kv_heads * hd + 3.0 * h * sh.ffn + 2.0 * h;
}

static const ff_layer_measure *measured_layer(const ff_device *dev, const ff_model *m,
                                              ff_precision prec, double b, int tp) {
  for (int i = 0; i < dev->n_layers; i++) {
    const ff_layer_measure *l = &dev->layers[i];
    if (l->precision == prec && (double)l->micro_batch_size == b && l->tp == tp &&
        strcmp(l->model, m->name) == 0)
      return l;
  }
  return NULL;
}

ff_attention ff_cost_attention_kernel(ff_attention a, ff_precision prec) {
  if (a == FF_ATTENTION_AUTO) /* what the CUDA backend runs by default (executor.md) */
    return prec == FF_PRECISION_BF16 ? FF_ATTENTION_GEMM : FF_ATTENTION_FUSED;
  if (a == FF_ATTENTION_TENSOR && prec != FF_PRECISION_BF16)
    return FF_ATTENTION_FUSED;
  return a;
}

static double larger(double x, double y) { return x > y ? x : y; }

/* Flash-style kernels (tensor, fused) keep the scores on chip: query t sees keys 0..t, so they
 * do s(s+1)/2 of the s² products per head. Forward: Q·Kᵀ and P·V; backward: Q·Kᵀ again, dV, dP,
 * dQ and dK. Each is at least its FLOPs at the flash efficiency and at least its operands'
 * traffic (forward: q, k, v read and the output written; backward: q, k, v, the output and its
 * gradient read, three gradients written). The GEMM kernel materialises the scores in fp32 in
 * chunks of R query rows (R·heads·s ≤ FF_COST_GEMM_ATTENTION_SCORES, R a multiple of 64), each
 * chunk against the keys up to its end: forward a GEMM writes them, a row kernel turns them into
 * probabilities (read, write), a GEMM reads them; backward the same first three, then four GEMMs
 * (dV, dP, dQ, dK) each reading or writing one score matrix and a row kernel forming dS (reads
 * P and dP, writes dS). Megatron-LM's core attention without flash attention (`megatron`:
 * megatron/model/transformer.py CoreAttention, megatron/model/fused_softmax.py) writes the whole
 * s×s score matrix of every head (the causal mask is applied, not skipped) in the training
 * precision: forward a GEMM, the softmax, attention dropout at Megatron's default 0.1 (reads,
 * writes, and writes a one-byte mask), a GEMM; backward two GEMMs (dP, dV), dropout's backward
 * (reads dP and the mask, writes), the softmax backward, two GEMMs (dQ, dK). Under 16-bit math
 * the softmax is one fused scale-mask-softmax kernel (forward read and write; backward reads P
 * and dP, writes dS). Under fp32 it is not fused (fused_softmax.py forward_torch_softmax):
 * scores × the layer-number scale (apply_query_key_layer_scaling, on by default), masked_fill_,
 * PyTorch's softmax, each a read and a write; a row of s floats fits in shared memory, so the
 * softmax reads it once (PyTorch 2.x cunn_SoftMaxForwardSmem). Its backward first forms
 * dP·P (reads two, writes), then reads that and P and writes dS; the mask's and the scale's
 * backward read and write once each. Forward 8 passes, backward 12 (bf16: 4 and 5). A GEMM
 * takes the longer of its FLOPs at the GEMM efficiency of one strided batch
 * (heads·rows × s × head dimension) and its pass over the scores. */
ff_attention_time ff_cost_attention_time(const ff_model *m, ff_precision prec, ff_attention a,
                                         const ff_device *dev, double heads, double kv_heads,
                                         double b) {
  ff_attention_time t = {0.0, 0.0};
  double s = (double)m->seq_len, hd = (double)(m->hidden / m->heads);
  if (heads <= 0 || b <= 0)
    return t;
  double elem = prec == FF_PRECISION_BF16 ? 2.0 : 4.0;
  double io_fwd = b * s * hd * elem * (2.0 * heads + 2.0 * kv_heads);
  double io_bwd = b * s * hd * elem * (4.0 * heads + 4.0 * kv_heads);
  a = ff_cost_attention_kernel(a, prec);
  if (a == FF_ATTENTION_TENSOR || a == FF_ATTENTION_FUSED) {
    double peak = ff_peak_flops(dev, a == FF_ATTENTION_TENSOR ? FF_PRECISION_BF16
                                                              : FF_PRECISION_FP32);
    double pairs = b * heads * s * (s + 1.0) / 2.0;
    t.fwd = larger(4.0 * pairs * hd / (peak * FF_COST_FLASH_EFFICIENCY_FWD),
                   ff_time_memory(dev, io_fwd));
    t.bwd = larger(10.0 * pairs * hd / (peak * FF_COST_FLASH_EFFICIENCY_BWD),
                   ff_time_memory(dev, io_bwd));
    return t;
  }
  /* The kernels that materialise the scores: how many score cells per head and sequence, in
   * what element size, in GEMMs of how many query rows, and their passes. */
  double cells, score_elem, rows, mask = 0.0;
  double gemms_fwd, gemms_bwd, passes_fwd, passes_bwd;
  if (a == FF_ATTENTION_MEGATRON) {
    cells = s * s;
    score_elem = elem;
    rows = s;
    gemms_fwd = 2.0, gemms_bwd = 4.0;
    /* softmax and dropout; fp32 adds the scale, the mask and the softmax backward's product */
    int fp32 = prec != FF_PRECISION_BF16;
    passes_fwd = fp32 ? 8.0 : 4.0, passes_bwd = fp32 ? 12.0 : 5.0;
    mask = ff_time_memory(dev, b * heads * cells); /* dropout's one-byte mask, each way */
  } else {
    rows = floor(FF_COST_GEMM_ATTENTION_SCORES / (heads * s));
    if (rows >= s)
      rows = s;
    else
      rows = rows < 64.0 ? 64.0 : floor(rows / 64.0) * 64.0;
    double c = ceil(s / rows); /* chunks: all but the last of `rows` rows */
    cells = rows * rows * (c - 1.0) * c / 2.0 + (s - (c - 1.0) * rows) * s;
    score_elem = 4.0;
    gemms_fwd = 2.0, gemms_bwd = 5.0;
    passes_fwd = 2.0, passes_bwd = 5.0;
  }
  double pass = ff_time_memory(dev, score_elem * b * heads * cells);
  double eff = gemm_efficiency(dev, prec, heads * rows, s, hd);
  double gemm = larger(2.0 * b * heads * cells * hd / (ff_peak_flops(dev, prec) * eff), pass);
  t.fwd = gemms_fwd * gemm + passes_fwd * pass + mask + ff_time_memory(dev, io_fwd);
  t.bwd = gemms_bwd * gemm + passes_bwd * pass + mask + ff_time_memory(dev, io_bwd);
  return t;
}

/* The modelled compute of one layer (forward, backward, and the attention's forward for selective
 * recompute) for a shard and micro-batch, without TP all-reduces or measured entries. */
typedef struct layer_model {
  double fwd, bwd, attn_fwd;
} layer_model;

static layer_model model_layer(const ff_model *m, ff_precision prec, ff_attention attn,
                               const ff_device *dev, ff_shard sh, double b) {
  double s = (double)m->seq_len, h = (double)m->hidden, hd = (double)(m->hidden / m->heads);
  double elem = prec == FF_PRECISION_BF16 ? 2.0 : 4.0, tokens = b * s;
  double gemm = ff_time_gemm(dev, prec, tokens, (sh.heads + 2.0 * sh.kv_heads) * hd, h) +
                ff_time_gemm(dev, prec, tokens, h, sh.heads * hd) +
                ff_time_gemm(dev, prec, tokens, 2.0 * sh.ffn, h) +
                ff_time_gemm(dev, prec, tokens, h, sh.ffn);
  ff_attention_time at = ff_cost_attention_time(m, prec, attn, dev, sh.heads, sh.kv_heads, b);
  /* Element-wise traffic per token: two RMSNorms (read+write h), two residual adds (2 reads, 1
   * write of h), RoPE on q and k, SwiGLU (read gate and up, write the product). */
  double bytes =
      tokens * elem * (4.0 * h + 6.0 * h + 2.0 * (sh.heads + sh.kv_heads) * hd + 3.0 * sh.ffn);
  double memory = ff_time_memory(dev, bytes);
  return (layer_model){gemm + at.fwd + memory, 2.0 * gemm + at.bwd + 2.0 * memory, at.fwd};
}

/* Without an entry of exactly (b, tp), the measured layer the model can carry over: one of the
 * same TP degree (its TP all-reduces included, as this rank's would be), else one of TP 1 (none
 * included); of those, the micro-batch size nearest b in ratio (the first listed on a tie). */
static const ff_layer_measure *nearest_layer(const ff_device *dev, const ff_model *m,
                                             ff_precision prec, double b, int tp) {
  const ff_layer_measure *best = NULL;
  double best_d = 0;
  for (int pass = 0; pass < 2 && !best; pass++) {
    int want = pass == 0 ? tp : 1;
    for (int i = 0; i < dev->n_layers; i++) {
      const ff_layer_measure *l = &dev->layers[i];
      if (l->precision != prec || l->tp != want || strcmp(l->model, m->name) != 0)
        continue;
      double d = fabs(log((double)l->micro_batch_size / b));
      if (!best || d < best_d)
        best = l, best_d = d;
    }
  }
  return best;
}

ff_layer_time ff_cost_layer_time(const ff_model *m, ff_precision prec, ff_attention attn,
                                 const ff_device *dev, ff_shard sh, double b, int tp,
                                 ff_recompute rc, double tp_allreduce) {
  layer_model lm = model_layer(m, prec, attn, dev, sh, b);
  ff_layer_time t;
  t.fwd = lm.fwd;
  t.bwd = lm.bwd;
  t.recompute = rc == FF_RECOMPUTE_FULL ? t.fwd : rc == FF_RECOMPUTE_SELECTIVE ? lm.attn_fwd : 0.0;
  t.tp_fwd = 2.0 * tp_allreduce;
  t.tp_bwd = (rc == FF_RECOMPUTE_FULL ? 4.0 : 2.0) * tp_allreduce;
  const ff_layer_measure *ml = measured_layer(dev, m, prec, b, tp);
  if (ml) {
    t.fwd = ml->forward_ms * 1e-3;
    t.bwd = ml->backward_ms * 1e-3;
    t.recompute = rc == FF_RECOMPUTE_FULL ? t.fwd
                  : rc == FF_RECOMPUTE_SELECTIVE ? lm.attn_fwd : 0.0;
    t.tp_fwd = 0.0;
    t.tp_bwd = rc == FF_RECOMPUTE_FULL ? 2.0 * tp_allreduce : 0.0;
    return t;
  }
  /* A measured layer of another micro-batch size (or of TP 1), carried over by the model: this
   * device runs the layer measured/modelled times the model's figure, forward and backward
   * apart. From TP 1 the reference is the whole layer, and the rank's TP all-reduces are added
   * as modelled; from the same degree the reference is this shard, the all-reduces inside. */
  const ff_layer_measure *near = nearest_layer(dev, m, prec, b, tp);
  if (!near)
    return t;
  bool same_tp = near->tp == tp;
  ff_shard whole = {(double)m->heads, (double)m->kv_heads, (double)m->ffn_hidden, sh.vocab};
  layer_model ref = model_layer(m, prec, attn, dev, same_tp ? sh : whole,
                                (double)near->micro_batch_size);
  if (!(ref.fwd > 0 && ref.bwd > 0))
    return t;
  double cf = near->forward_ms * 1e-3 / ref.fwd, cb = near->backward_ms * 1e-3 / ref.bwd;
  t.fwd = cf * lm.fwd;
  t.bwd = cb * lm.bwd;
  t.recompute = rc == FF_RECOMPUTE_FULL ? t.fwd
                : rc == FF_RECOMPUTE_SELECTIVE ? cf * lm.attn_fwd : 0.0;
  if (same_tp) {
    t.tp_fwd = 0.0;
    t.tp_bwd = rc == FF_RECOMPUTE_FULL ? 2.0 * tp_allreduce : 0.0;
  }
  return t;
}

/* ---- the embedding and the LM head ------------------------------------------------------ */

double ff_cost_wire_bytes(const ff_training *t) { return t->wire == FF_WIRE_BF16 ? 2.0 : 4.0; }

/* The lookup writes b·s·h rows in the wire's element (the activations between kernels); its
 * backward reads the rows' gradients and adds them into the fp32 gradient of the table. A
 * vocabulary-parallel lookup sums the group's partial rows once, forward (ffrun's embed_forward,
 * Megatron-LM's VocabParallelEmbedding); the backward needs no sum, as every rank already holds
 * the whole input gradient. */
ff_end_time ff_cost_embedding_time(const ff_model *m, const ff_training *t, const ff_device *dev,
                                   double b) {
  double n = b * (double)m->seq_len, h = (double)m->hidden;
  ff_end_time e = {0};
  e.fwd = ff_time_memory(dev, n * h * ff_cost_wire_bytes(t));
  e.bwd = ff_time_memory(dev, 2.0 * n * h * 4.0);
  e.ar_fwd = 1;
  return e;
}

/* Final norm, the vocabulary-parallel logits GEMM and the loss over fp32 logits of b·s × V_r.
 * ffrun (executor/model_layers.c head_forward_backward), all in the forward: the norm, the
 * GEMM, a row max, a row sum and one pass that writes the loss and the logits' gradient in
 * place (read and write; under bf16 the gradient is written in bf16), the GEMMs of the input and
 * weight gradients, the norm's backward; the TP group takes the max and the sum of b·s row
 * statistics and sums the head's input gradient. Megatron-LM (megatron/core/tensor_parallel/
 * cross_entropy.py, _VocabParallelCrossEntropy, on logits made fp32 first by float16_to_fp32
 * under 16-bit math: a 2-byte read and a 4-byte write, and the same back in the backward):
 * forward the max (a read), the max subtracted into a new tensor (read, write), exp in place
 * (read, write), the sum (read), the division in place (read, write), with three row all-
 * reduces (max, the target's logit, sum); backward one multiply in place (read, write), then the
 * two GEMMs, and the sum of the input gradient (copy_to_tensor_model_parallel_region). */
ff_end_time ff_cost_head_time(const ff_model *m, const ff_training *t, const ff_device *dev,
                              ff_shard sh, double b) {
  double n = b * (double)m->seq_len, h = (double)m->hidden;
  bool bf16 = t->precision == FF_PRECISION_BF16;
  double gemm = ff_time_gemm(dev, t->precision, n, sh.vocab, h);
  double norm_fwd = ff_time_memory(dev, 2.0 * n * h * 4.0);
  double norm_bwd = ff_time_memory(dev, 3.0 * n * h * 4.0);
  double pass = ff_time_memory(dev, n * sh.vocab * 4.0); /* one pass over the fp32 logits */
  ff_end_time e = {0};
  if (t->attention == FF_ATTENTION_MEGATRON) {
    e.fwd = gemm + norm_fwd + (bf16 ? 9.5 : 8.0) * pass;
    e.bwd = 2.0 * gemm + norm_bwd + (bf16 ? 3.5 : 2.0) * pass;
    e.ar_bwd = 1;
    e.ar_small_fwd = 3;
  } else {
    e.fwd = 3.0 * gemm + norm_fwd + norm_bwd + (bf16 ? 3.5 : 4.0) * pass;
    e.ar_fwd = 1;
    e.ar_small_fwd = 2;
  }
  return e;
}

double ff_cost_end_tp_fwd(ff_end_time e, double ar, double ar_small) {
  return e.ar_fwd * ar + e.ar_small_fwd * ar_small;
}

double ff_cost_end_tp_bwd(ff_end_time e, double ar, double ar_small) {
  return e.ar_bwd * ar + e.ar_small_bwd * ar_small;
}
