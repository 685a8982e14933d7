/* graph.c — the device graph and its canonical node order (see graph.h).
 *
 * Clustering by link speed is single linkage over the distinct inter-node bandwidths: starting
 * from the whole cluster (joined at the slowest bandwidth), a set of nodes splits into the
 * components of its links of at least the next faster bandwidth, recursively. Components are
 * found without listing pairs: where the default link is fast enough, by a breadth-first search
 * over the complement (only the pairs slower than the threshold are ever looked at); elsewhere
 * from the overrides and groups that reach the threshold. Siblings are ordered by what they hold
 * (compute, then GPUs, then memory), the nodes of a finest cluster along a greedy best-connected
 * path from its least-connected node, turned around where that joins it to its neighbours in the
 * order by faster links. */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

/* ---- links ------------------------------------------------------------------------------- */

static int cmp_pair(int a1, int b1, int a2, int b2) {
  if (a1 != a2)
    return a1 < a2 ? -1 : 1;
  return b1 < b2 ? -1 : (b1 > b2);
}

ff_link ff_graph_link(const ff_graph *g, int a, int b) {
  int x = a < b ? a : b, y = a < b ? b : a;
  int lo = 0, hi = g->n_ov - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = cmp_pair(g->ov_a[mid], g->ov_b[mid], x, y);
    if (c == 0)
      return g->ov_link[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return ff_cluster_base_link(g->cluster, a, b);
}

static const ff_graph *sort_graph; /* qsort has no context argument; set only around qsort */

static int cmp_override(const void *p, const void *q) {
  const ff_net_override *o = &sort_graph->cluster->overrides[*(const int *)p];
  const ff_net_override *r = &sort_graph->cluster->overrides[*(const int *)q];
  int oa = o->node_a < o->node_b ? o->node_a : o->node_b, ob = o->node_a ^ o->node_b ^ oa;
  int ra = r->node_a < r->node_b ? r->node_a : r->node_b, rb = r->node_a ^ r->node_b ^ ra;
  return cmp_pair(oa, ob, ra, rb);
}

static int cmp_double(const void *p, const void *q) {
  double a = *(const double *)p, b = *(const double *)q;
  return a < b ? -1 : (a > b);
}

/* ---- node and cluster keys --------------------------------------------------------------- */

static double node_flops(const ff_graph *g, int n) {
  const ff_node *nd = &g->cluster->nodes[n];
  return ff_peak_flops(&g->cluster->devices[nd->device], g->precision) * nd->gpus;
}

/* Nodes by what they hold: compute, GPUs, memory, island structure; the name last. */
static int cmp_node_key(const ff_graph *g, int x, int y) {
  const ff_node *a = &g->cluster->nodes[x], *b = &g->cluster->nodes[y];
  const ff_device *da = &g->cluster->devices[a->device], *db = &g->cluster->devices[b->device];
  double pa = ff_peak_flops(da, g->precision), pb = ff_peak_flops(db, g->precision);
  if (pa != pb)
    return pa > pb ? -1 : 1;
  if (a->gpus != b->gpus)
    return a->gpus > b->gpus ? -1 : 1;
  if (da->memory_gib != db->memory_gib)
    return da->memory_gib > db->memory_gib ? -1 : 1;
  if (a->island_gpus != b->island_gpus)
    return a->island_gpus > b->island_gpus ? -1 : 1;
  if (a->island.bandwidth_gb_per_s != b->island.bandwidth_gb_per_s)
    return a->island.bandwidth_gb_per_s > b->island.bandwidth_gb_per_s ? -1 : 1;
  if (a->intra.bandwidth_gb_per_s != b->intra.bandwidth_gb_per_s)
    return a->intra.bandwidth_gb_per_s > b->intra.bandwidth_gb_per_s ? -1 : 1;
  return strcmp(a->name, b->name);
}

static int cmp_node_key_q(const void *p, const void *q) {
  return cmp_node_key(sort_graph, *(const int *)p, *(const int *)q);
}

typedef struct cluster_key {
  double flops, memory_gib;
  int64_t gpus;
  int first;  /* index of its first member in the member array */
  int n;
  int best;   /* its first node by cmp_node_key, the last tie-break */
} cluster_key;

static int cmp_cluster_key(const void *p, const void *q) {
  const cluster_key *a = p, *b = q;
  if (a->flops != b->flops)
    return a->flops > b->flops ? -1 : 1;
  if (a->gpus != b->gpus)
    return a->gpus > b->gpus ? -1 : 1;
  if (a->memory_gib != b->memory_gib)
    return a->memory_gib > b->memory_gib ? -1 : 1;
  if (a->n != b->n)
    return a->n < b->n ? -1 : 1;
  return cmp_node_key(sort_graph, a->best, b->best);
}

/* ---- components at a bandwidth threshold ------------------------------------------------- */

typedef struct work {
  const ff_graph *g;
  int *parent;    /* union-find over nodes */
  int *in_set;    /* stamp: node belongs to the set being split */
  int stamp;
  int *queue, *pending, *label_of;
  int *out, n_out, next_leaf, top;
} work;

static int uf_find(int *parent, int x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

static void uf_union(int *parent, int x, int y) {
  x = uf_find(parent, x), y = uf_find(parent, y);
  if (x != y)
    parent[x < y ? y : x] = x < y ? x : y;
}

/* Breadth-first search over the nodes S[0..n) joined by links of at least `bw`, looking only at
 * the pairs slower than that (each once) besides the joins: O(n + slow pairs). Unions into
 * w->parent. */
static void complement_search(work *w, const int *S, int n, double bw) {
  int n_pending = n;
  memcpy(w->pending, S, (size_t)n * sizeof *S);
  while (n_pending > 0) {
    int head = 0, tail = 0;
    w->queue[tail++] = w->pending[--n_pending];
    while (head < tail) {
      int x = w->queue[head++], keep = 0;
      for (int i = 0; i < n_pending; i++) {
        int y = w->pending[i];
        if (ff_graph_link(w->g, x, y).bandwidth_gb_per_s >= bw) {
          uf_union(w->parent, x, y);
          w->queue[tail++] = y;
        } else {
          w->pending[keep++] = y;
        }
      }
      n_pending = keep;
    }
  }
}

/* Label S[0..n) by its components under links of at least `bw`: labels 0..k−1 in order of
 * first appearance in S. Returns k. */
static int components(work *w, const int *S, int n, double bw, int *label) {
  const ff_graph *g = w->g;
  const ff_cluster *c = g->cluster;
  w->stamp++;
  for (int i = 0; i < n; i++) {
    w->parent[S[i]] = S[i];
    w->in_set[S[i]] = w->stamp;
  }
  if (c->net_default.bandwidth_gb_per_s >= bw) {
    complement_search(w, S, n, bw);
  } else {
    for (int i = 0; i < g->n_ov; i++)
      if (g->ov_link[i].bandwidth_gb_per_s >= bw && w->in_set[g->ov_a[i]] == w->stamp &&
          w->in_set[g->ov_b[i]] == w->stamp)
        uf_union(w->parent, g->ov_a[i], g->ov_b[i]);
    for (int gi = 0; gi < c->n_groups; gi++) {
      const ff_net_group *grp = &c->groups[gi];
      if (grp->link.bandwidth_gb_per_s < bw)
        continue;
      int m = 0;
      for (int k = 0; k < grp->n_nodes; k++)
        if (w->in_set[grp->nodes[k]] == w->stamp)
          w->queue[m++] = grp->nodes[k];
      int slow = 0; /* overrides that slow a pair of this group below the threshold */
      for (int i = 0; i < g->n_ov; i++)
        if (g->ov_link[i].bandwidth_gb_per_s < bw && c->nodes[g->ov_a[i]].group == gi &&
            c->nodes[g->ov_b[i]].group == gi && w->in_set[g->ov_a[i]] == w->stamp &&
            w->in_set[g->ov_b[i]] == w->stamp)
          slow++;
      if (slow < m - 1) { /* a complete graph missing fewer than m − 1 edges is connected */
        for (int k = 1; k < m; k++)
          uf_union(w->parent, w->queue[0], w->queue[k]);
      } else if (m > 1) {
        int *members = malloc((size_t)m * sizeof *members);
        if (members) {
          memcpy(members, w->queue, (size_t)m * sizeof *members);
          complement_search(w, members, m, bw);
          free(members);
        }
      }
    }
  }
  int k = 0;
  for (int i = 0; i < n; i++)
    w->label_of[S[i]] = -1;
  for (int i = 0; i < n; i++) {
    int r = uf_find(w->parent, S[i]);
    if (w->label_of[r] < 0)
      w->label_of[r] = k++;
    label[i] = w->label_of[r];
  }
  return k;
}

/* ---- the order --------------------------------------------------------------------------- */

/* The nodes of a finest cluster along a greedy best-connected path: from the node with the least
 * summed bandwidth to the others, always to the fastest-linked node not yet placed. Above 512
 * nodes (O(n²) links) they are sorted by their keys instead. */
static void leaf_path(work *w, int *S, int n) {
  const ff_graph *g = w->g;
  sort_graph = g;
  qsort(S, (size_t)n, sizeof *S, cmp_node_key_q);
  sort_graph = NULL;
  if (n <= 2 || n > 512)
    return;
  double *conn = calloc((size_t)n, sizeof *conn);
  if (!conn)
    return;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      double b = ff_graph_link(g, S[i], S[j]).bandwidth_gb_per_s;
      conn[i] += b;
      conn[j] += b;
    }
  int start = 0; /* S is in key order, so ties keep the better key */
  for (int i = 1; i < n; i++)
    if (conn[i] < conn[start])
      start = i;
  int x = S[start];
  S[start] = S[0];
  S[0] = x;
  double c0 = conn[start];
  conn[start] = conn[0];
  conn[0] = c0;
  for (int k = 1; k < n; k++) {
    int best = k;
    double best_bw = ff_graph_link(g, S[k - 1], S[k]).bandwidth_gb_per_s;
    for (int i = k + 1; i < n; i++) {
      double b = ff_graph_link(g, S[k - 1], S[i]).bandwidth_gb_per_s;
      if (b > best_bw || (b == best_bw && cmp_node_key(g, S[i], S[best]) < 0)) {
        best = i;
        best_bw = b;
      }
    }
    x = S[best];
    memmove(S + k + 1, S + k, (size_t)(best - k) * sizeof *S);
    S[k] = x;
  }
  free(conn);
}

static bool order_rec(work *w, int *S, int n, int level, int depth) {
  const ff_graph *g = w->g;
  int *label = malloc((size_t)n * sizeof *label);
  if (!label)
    return false;
  int k = 1;
  while (level < g->n_levels && (k = components(w, S, n, g->levels[level], label)) == 1)
    level++;
  if (level >= g->n_levels || n == 1) {
    leaf_path(w, S, n);
    for (int i = 0; i < n; i++) {
      g->order[w->n_out] = S[i];
      g->leaf_of[w->n_out] = w->next_leaf;
      g->top_of[w->n_out] = w->top;
      w->n_out++;
    }
    w->next_leaf++;
    free(label);
    return true;
  }
  /* Group S by component (stable), key each component, recurse in key order. */
  int *count = calloc((size_t)k + 1, sizeof *count);
  int *sorted = malloc((size_t)n * sizeof *sorted);
  cluster_key *keys = calloc((size_t)k, sizeof *keys);
  bool ok = count && sorted && keys;
  if (ok) {
    for (int i = 0; i < n; i++)
      count[label[i] + 1]++;
    for (int i = 0; i < k; i++)
      count[i + 1] += count[i];
    for (int i = 0; i < k; i++) {
      keys[i].first = count[i];
      keys[i].n = count[i + 1] - count[i];
      keys[i].best = -1;
    }
    for (int i = 0; i < n; i++) {
      int l = label[i], x = S[i];
      sorted[count[l]++] = x;
      cluster_key *ck = &keys[l];
      const ff_node *nd = &g->cluster->nodes[x];
      ck->flops += node_flops(g, x);
      ck->gpus += nd->gpus;
      ck->memory_gib += g->cluster->devices[nd->device].memory_gib * nd->gpus;
      if (ck->best < 0 || cmp_node_key(g, x, ck->best) < 0)
        ck->best = x;
    }
    sort_graph = g;
    qsort(keys, (size_t)k, sizeof *keys, cmp_cluster_key);
    sort_graph = NULL;
    for (int i = 0; i < k && ok; i++) {
      if (depth == 0)
        w->top = i;
      ok = order_rec(w, sorted + keys[i].first, keys[i].n, level + 1, depth + 1);
    }
  }
  free(count), free(sorted), free(keys), free(label);
  return ok;
}

/* Turn each finest cluster's path around where that joins it to its neighbours in the order by
 * faster links (left to right; a reversal must strictly gain bandwidth), so that a pipeline laid
 * along the order crosses from one cluster to the next on the best link between them. */
static void orient_leaves(ff_graph *g) {
  int n = g->cluster->n_nodes;
  for (int a = 0; a < n;) {
    int b = a;
    while (b < n && g->leaf_of[b] == g->leaf_of[a])
      b++;
    if (b - a > 1) {
      double keep = 0, flip = 0;
      if (a > 0) {
        keep += ff_graph_link(g, g->order[a - 1], g->order[a]).bandwidth_gb_per_s;
        flip += ff_graph_link(g, g->order[a - 1], g->order[b - 1]).bandwidth_gb_per_s;
      }
      if (b < n) {
        keep += ff_graph_link(g, g->order[b - 1], g->order[b]).bandwidth_gb_per_s;
        flip += ff_graph_link(g, g->order[a], g->order[b]).bandwidth_gb_per_s;
      }
      if (flip > keep)
        for (int i = a, j = b - 1; i < j; i++, j--) {
          int x = g->order[i];
          g->order[i] = g->order[j];
          g->order[j] = x;
        }
    }
    a = b;
  }
}

/* ---- building ---------------------------------------------------------------------------- */

void ff_graph_free(ff_graph *g) {
  free(g->ov_a), free(g->ov_b), free(g->ov_link), free(g->levels);
  free(g->order), free(g->leaf_of), free(g->top_of);
  memset(g, 0, sizeof *g);
}

ff_status ff_graph_build(const ff_cluster *c, ff_precision precision, ff_graph *g) {
  memset(g, 0, sizeof *g);
  g->cluster = c;
  g->precision = precision;
  int n = c->n_nodes, no = c->n_overrides;
  size_t nn = (size_t)n ? (size_t)n : 1, nov = (size_t)no ? (size_t)no : 1;
  int *idx = malloc(nov * sizeof *idx);
  g->ov_a = malloc(nov * sizeof *g->ov_a);
  g->ov_b = malloc(nov * sizeof *g->ov_b);
  g->ov_link = malloc(nov * sizeof *g->ov_link);
  g->levels = malloc((nov + (size_t)c->n_groups + 1) * sizeof *g->levels);
  g->order = malloc(nn * sizeof *g->order);
  g->leaf_of = malloc(nn * sizeof *g->leaf_of);
  g->top_of = malloc(nn * sizeof *g->top_of);
  work w = {.g = g};
  w.parent = malloc(nn * sizeof *w.parent);
  w.in_set = calloc(nn, sizeof *w.in_set);
  w.queue = malloc(nn * sizeof *w.queue);
  w.pending = malloc(nn * sizeof *w.pending);
  w.label_of = malloc(nn * sizeof *w.label_of);
  int *all = malloc(nn * sizeof *all);
  ff_status st = FF_ERR_RUNTIME;
  if (!idx || !g->ov_a || !g->ov_b || !g->ov_link || !g->levels || !g->order || !g->leaf_of ||
      !g->top_of || !w.parent || !w.in_set || !w.queue || !w.pending || !w.label_of || !all)
    goto done;
  for (int i = 0; i < no; i++)
    idx[i] = i;
  sort_graph = g;
  qsort(idx, (size_t)no, sizeof *idx, cmp_override);
  sort_graph = NULL;
  for (int i = 0; i < no; i++) {
    const ff_net_override *o = &c->overrides[idx[i]];
    g->ov_a[i] = o->node_a < o->node_b ? o->node_a : o->node_b;
    g->ov_b[i] = o->node_a < o->node_b ? o->node_b : o->node_a;
    g->ov_link[i] = o->link;
  }
  g->n_ov = no;
  /* Levels: every bandwidth a pair of nodes can have, slowest first, without repeats. */
  int nl = 0;
  g->levels[nl++] = c->net_default.bandwidth_gb_per_s;
  for (int i = 0; i < c->n_groups; i++)
    g->levels[nl++] = c->groups[i].link.bandwidth_gb_per_s;
  for (int i = 0; i < no; i++)
    g->levels[nl++] = g->ov_link[i].bandwidth_gb_per_s;
  qsort(g->levels, (size_t)nl, sizeof *g->levels, cmp_double);
  g->n_levels = 0;
  for (int i = 0; i < nl; i++)
    if (g->n_levels == 0 || g->levels[i] != g->levels[g->n_levels - 1])
      g->levels[g->n_levels++] = g->levels[i];
  for (int i = 0; i < n; i++)
    all[i] = i;
  /* At the slowest bandwidth every pair is joined: splitting starts one level up. */
  if (n > 0 && !order_rec(&w, all, n, 1, 0))
    goto done;
  orient_leaves(g);
  st = FF_OK;
done:
  free(idx), free(all);
  free(w.parent), free(w.in_set), free(w.queue), free(w.pending), free(w.label_of);
  if (st != FF_OK)
    ff_graph_free(g);
  return st;
}
