/* graph.h — the cluster as a graph of nodes whose edges are the links the cost model uses, and
 * the canonical node order the search forms pipelines from.
 *
 * A vertex is a node (its GPUs share one device type; inside it the island and intra-node links
 * of ff_cluster_gpu_link apply). The edge between two nodes is ff_cluster_node_link — the one
 * function the cost model also uses — evaluated through an index of the overrides, so no pair is
 * materialised: at 100,000 GPUs the graph costs O(nodes + overrides) memory.
 *
 * The canonical order comes from the links alone: nodes are clustered by link speed (single
 * linkage — two nodes share a cluster at bandwidth b when a path of links of at least b joins
 * them), the clusters are ordered by what they hold, and the nodes of the finest clusters along
 * the best-connected path. How the file writes a link (a group, per-pair overrides, the default)
 * and how it names or orders its nodes do not change the order, except where names break a tie
 * between nodes that hold the same devices and links (docs/planner.md, "The device graph"). */
#ifndef FF_GRAPH_H
#define FF_GRAPH_H

#include "ff_cost.h"
#include "ff_format.h"

typedef struct ff_graph {
  const ff_cluster *cluster;
  ff_precision precision;
  /* Overrides sorted by (smaller node, larger node), for O(log n) lookup. */
  int *ov_a, *ov_b;
  ff_link *ov_link;
  int n_ov;
  /* Distinct inter-node bandwidths, slowest first. */
  double *levels;
  int n_levels;
  /* The canonical order of the nodes, and for each position the id of the finest link cluster
   * (a run of equal ids is one cluster) and of the coarsest non-trivial cluster (a rack or a
   * site: the top level at which the cluster splits). */
  int *order;
  int *leaf_of, *top_of;
} ff_graph;

/* Build the graph of a cluster. FF_ERR_RUNTIME on allocation failure. */
ff_status ff_graph_build(const ff_cluster *c, ff_precision precision, ff_graph *g);
void ff_graph_free(ff_graph *g);
/* The link between two distinct nodes (equal to ff_cluster_node_link). */
ff_link ff_graph_link(const ff_graph *g, int node_a, int node_b);

#endif
