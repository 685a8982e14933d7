/* partition.h — METIS partitions of the device graph, as node orders the search lays pipelines
 * over.
 *
 * The graph's vertices are the nodes whose device type is in use, weighted by compute (peak
 * FLOP/s) and memory; its edges are the links between nodes, weighted by bandwidth, so a
 * minimum cut keeps fast links inside a part and puts slow ones between parts. Each partition
 * into k parts becomes a node order: the parts one after another (largest compute first), the
 * nodes of a part in the canonical order (graph.h). Over such an order the search forms either
 * one pipeline per part (layout "parts": a part's units are the stages of its pipeline, so
 * pipelines differ in stage count and device mix and DP crosses the cut) or stripes pipelines
 * over it (layout "striped": consecutive stages in consecutive parts, so activations cross the
 * cut and DP stays inside a part). On clusters of at most 64 nodes, each part of the top-level link
 * clusters (up to 8 of them) and of the two-part METIS partitions also stands alone as an order,
 * so a plan may leave a whole site or rack idle — not only whole device types. */
#ifndef FF_PARTITION_H
#define FF_PARTITION_H

#include <stdbool.h>

#include "graph.h"

typedef struct ff_node_order {
  int *order;   /* active nodes only, n of them */
  int *part;    /* part of order[i], nondecreasing */
  int n, n_parts;
  bool subset;   /* one part of another order alone: the rest of the cluster stays idle */
  bool metis;    /* from a METIS partition (absent with --without partition) */
  char what[64]; /* "canonical order", "METIS k=4 seed 1", "part 1 of METIS k=2 seed 1 alone" */
} ff_node_order;

typedef struct ff_node_orders {
  ff_node_order *items;
  int n;
} ff_node_orders;

/* The canonical order of the active nodes (one part) followed by one order per distinct METIS
 * partition for each k in 2..max_k (k < active nodes) and each of n_seeds seeds. A partition
 * METIS rejects or returns with an empty part is skipped. FF_ERR_RUNTIME on allocation failure.
 * `active_device[d]`: device type d is in use. With `use_metis` false only the canonical order. */
ff_status ff_partition_orders(const ff_graph *g, const bool *active_device, bool use_metis,
                              int max_k, int n_seeds, ff_node_orders *out);
void ff_node_orders_free(ff_node_orders *o);

#endif
