/* ff_cluster.c — ff-cluster/1: nodes, their device types and the links inside and between them.
 *
 * Device types come from files (paths relative to the cluster file) or inline objects. Node names
 * are indexed once, sorted, so plans of 100,000 ranks resolve their node references in
 * O(log n) each. The link between two nodes is an override for the pair, else their group's
 * link, else the default. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ff_format.h"
#include "ff_format_internal.h"

#define CLUSTER_MAX_NODES (1 << 20)

static const ff_cluster *sort_ctx; /* qsort has no context argument; only used inside sort */

static int cmp_node_name(const void *a, const void *b) {
  return strcmp(sort_ctx->nodes[*(const int *)a].name, sort_ctx->nodes[*(const int *)b].name);
}

int ff_cluster_find_node(const ff_cluster *c, const char *name) {
  int lo = 0, hi = c->n_nodes - 1;
  if (!c->node_by_name)
    return -1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int cmp = strcmp(name, c->nodes[c->node_by_name[mid]].name);
    if (cmp == 0)
      return c->node_by_name[mid];
    if (cmp < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return -1;
}

int ff_cluster_find_device(const ff_cluster *c, const char *name) {
  for (int i = 0; i < c->n_devices; i++)
    if (strcmp(c->devices[i].name, name) == 0)
      return i;
  return -1;
}

ff_link ff_cluster_base_link(const ff_cluster *c, int a, int b) {
  int g = c->nodes[a].group;
  if (g >= 0 && g == c->nodes[b].group)
    return c->groups[g].link;
  return c->net_default;
}

ff_link ff_cluster_node_link(const ff_cluster *c, int a, int b) {
  for (int i = 0; i < c->n_overrides; i++) {
    const ff_net_override *o = &c->overrides[i];
    if ((o->node_a == a && o->node_b == b) || (o->node_a == b && o->node_b == a))
      return o->link;
  }
  return ff_cluster_base_link(c, a, b);
}

static bool read_link(ff_jobj *o, ff_link *link, bool required, const char *bw_key,
                      const char *lat_key) {
  bool ok = ff_jobj_num(o, bw_key, required, FF_POSITIVE(100000), &link->bandwidth_gb_per_s);
  ok &= ff_jobj_num(o, lat_key, required, FF_CLOSED(0, 1e6), &link->latency_us);
  return ok;
}

/* A key that must be absent: report it with the reason. */
static bool forbid(ff_jobj *o, const char *key, const char *why) {
  if (!ff_jobj_get(o, key, false))
    return true;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  ff_diag_error(o->diag, p, "not allowed here: %s", why);
  return false;
}

static void known_devices(const ff_cluster *c, char *out, size_t cap) {
  size_t j = 0;
  out[0] = '\0';
  for (int i = 0; i < c->n_devices && j < cap; i++)
    j += (size_t)snprintf(out + j, cap - j, "%s%s", i ? ", " : "", c->devices[i].name);
}

static bool read_device_types(ff_jobj *top, const char *base_dir, ff_diag *d, ff_cluster *c) {
  const cJSON *arr = ff_jobj_array(top, "device_types", true, 1, 256);
  if (!arr)
    return false;
  char base[FF_PATH_MAX];
  ff_jobj_path(top, "device_types", base, sizeof base);
  c->devices = calloc((size_t)cJSON_GetArraySize(arr), sizeof *c->devices);
  if (!c->devices)
    return false;
  bool ok = true;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    char p[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s[%d]", base, i);
    ff_device *dev = &c->devices[i];
    if (cJSON_IsString(e)) {
      char *file = ff_path_join(base_dir ? base_dir : ".", e->valuestring);
      if (!file)
        return false;
      /* Errors inside the device file name that file; the reference says where it came from. */
      ff_status st = ff_load_referenced(file, p, "device file", d);
      if (st == FF_OK)
        st = ff_load_device(file, d, dev);
      if (st != FF_OK) {
        if (access(file, R_OK) == 0)
          ff_diag_error(d, p, "device file \"%s\" is not valid (errors above)", e->valuestring);
        free(file);
        ok = false;
        c->n_devices = i + 1;
        continue;
      }
      free(file);
      dev->ref = strdup(e->valuestring);
      if (!dev->ref)
        ok = false;
    } else if (cJSON_IsObject(e)) {
      if (ff_device_from_json(e, p, true, d, dev) != FF_OK)
        ok = false;
    } else {
      ff_diag_error(d, p, "expected a device file path (a string) or a device object");
      ok = false;
    }
    c->n_devices = i + 1;
    for (int j = 0; ok && j < i; j++) {
      if (strcmp(c->devices[j].name, dev->name) == 0) {
        ff_diag_error(d, p, "device type \"%s\" is defined twice (also %s[%d])", dev->name,
                      base, j);
        ok = false;
      }
    }
  }
  return ok;
}

static bool read_node(ff_diag *d, const cJSON *e, const char *p, ff_cluster *c, ff_node *node) {
  ff_jobj o;
  if (!ff_jobj_open(&o, d, e, p))
    return false;
  ff_name device;
  int64_t gpus = 0, island = 0;
  bool ok = ff_jobj_name(&o, "name", true, node->name);
  bool have_device = ff_jobj_name(&o, "device", true, device);
  ok &= have_device;
  if (!ff_jobj_int(&o, "gpus", true, 1, 1024, &gpus))
    gpus = 0;
  node->gpus = (int)gpus;
  node->device = -1;
  node->group = -1;
  if (have_device) {
    node->device = ff_cluster_find_device(c, device);
    if (node->device < 0 && c->n_devices > 0) {
      char known[1024], q[FF_PATH_MAX];
      known_devices(c, known, sizeof known);
      ff_jobj_path(&o, "device", q, sizeof q);
      ff_diag_error(d, q, "\"%s\" is not a known device type (known: %s)", device, known);
      ok = false;
    }
  }
  bool gpus_ok = gpus > 0, island_ok = gpus_ok;
  ok &= gpus_ok;
  island = gpus;
  if (ff_jobj_get(&o, "island_gpus", false)) {
    island_ok = ff_jobj_int(&o, "island_gpus", false, 1, gpus_ok ? gpus : 1024, &island);
    if (island_ok && gpus_ok && gpus % island != 0) {
      char q[FF_PATH_MAX];
      ff_jobj_path(&o, "island_gpus", q, sizeof q);
      ff_diag_error(d, q, "%lld does not divide gpus (%lld)", (long long)island, (long long)gpus);
      island_ok = false;
    }
    ok &= island_ok;
  }
  node->island_gpus = (int)island;
  int64_t nics = 1;
  if (ff_jobj_get(&o, "nics", false))
    ok &= ff_jobj_int(&o, "nics", false, 1, 64, &nics);
  node->nics = (int)nics;
  node->nic_bandwidth_gb_per_s = 0.0;
  if (ff_jobj_get(&o, "nic_bandwidth_gb_per_s", false))
    ok &= ff_jobj_num(&o, "nic_bandwidth_gb_per_s", false, FF_POSITIVE(100000),
                      &node->nic_bandwidth_gb_per_s);
  static const char *const link_keys[] = {"island_bandwidth_gb_per_s", "island_latency_us",
                                          "intra_bandwidth_gb_per_s", "intra_latency_us"};
  if (!gpus_ok || !island_ok) {
    /* Which link keys belong depends on gpus and island_gpus; with either wrong, any verdict
     * on them would be a guess. Mark them known and move on. */
    for (int k = 0; k < 4; k++)
      ff_jobj_get(&o, link_keys[k], false);
  } else {
    if (island > 1)
      ok &= read_link(&o, &node->island, true, link_keys[0], link_keys[1]);
    else {
      ok &= forbid(&o, link_keys[0], "island_gpus is 1 (no fast-link island)");
      ok &= forbid(&o, link_keys[1], "island_gpus is 1 (no fast-link island)");
    }
    if (island < gpus)
      ok &= read_link(&o, &node->intra, true, link_keys[2], link_keys[3]);
    else {
      ok &= forbid(&o, link_keys[2], "the whole node is one island");
      ok &= forbid(&o, link_keys[3], "the whole node is one island");
    }
  }
  ff_jobj_close(&o);
  return ok;
}

static bool index_nodes(ff_diag *d, ff_cluster *c, const char *nodes_path) {
  c->node_by_name = malloc((size_t)c->n_nodes * sizeof *c->node_by_name);
  if (!c->node_by_name)
    return false;
  for (int i = 0; i < c->n_nodes; i++)
    c->node_by_name[i] = i;
  sort_ctx = c;
  qsort(c->node_by_name, (size_t)c->n_nodes, sizeof *c->node_by_name, cmp_node_name);
  sort_ctx = NULL;
  bool ok = true;
  for (int i = 1; i < c->n_nodes; i++) {
    int a = c->node_by_name[i - 1], b = c->node_by_name[i];
    if (strcmp(c->nodes[a].name, c->nodes[b].name) == 0) {
      char p[FF_PATH_MAX];
      int first = a < b ? a : b, second = a < b ? b : a;
      snprintf(p, sizeof p, "%s[%d].name", nodes_path, second);
      ff_diag_error(d, p, "node name \"%s\" is used twice (also %s[%d])", c->nodes[b].name,
                    nodes_path, first);
      ok = false;
    }
  }
  return ok;
}

/* A node name inside the network section: must exist. */
static int resolve_node(ff_diag *d, const ff_cluster *c, const cJSON *v, const char *p) {
  ff_name name;
  if (!ff_json_as_name(d, v, p, name))
    return -1;
  int node = ff_cluster_find_node(c, name);
  if (node < 0)
    ff_diag_error(d, p, "\"%s\" is not a node of this cluster", name);
  return node;
}

static int cmp_group_name(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  int cmp = strcmp(sort_ctx->groups[x].name, sort_ctx->groups[y].name);
  return cmp ? cmp : (x > y) - (x < y);
}

/* Group names are unique: sorted once, O(G log G), so racks of a 10⁶-node cluster are cheap. */
static bool unique_group_names(ff_diag *d, ff_cluster *c, const char *base) {
  int *order = malloc(((size_t)c->n_groups + 1) * sizeof *order);
  if (!order)
    return false;
  for (int i = 0; i < c->n_groups; i++)
    order[i] = i;
  sort_ctx = c;
  qsort(order, (size_t)c->n_groups, sizeof *order, cmp_group_name);
  sort_ctx = NULL;
  bool ok = true;
  for (int i = 1; i < c->n_groups && ok; i++) {
    const ff_net_group *a = &c->groups[order[i - 1]], *b = &c->groups[order[i]];
    if (strcmp(a->name, b->name) == 0) {
      char p[FF_PATH_MAX];
      snprintf(p, sizeof p, "%s[%d].name", base, order[i]);
      ff_diag_error(d, p, "group name \"%s\" is used twice (also %s[%d])", b->name, base,
                    order[i - 1]);
      ok = false;
    }
  }
  free(order);
  return ok;
}

static bool read_groups(ff_jobj *no, ff_diag *d, ff_cluster *c) {
  const cJSON *arr = ff_jobj_array(no, "groups", false, 0, CLUSTER_MAX_NODES);
  if (!arr)
    return !ff_jobj_get(no, "groups", false);
  char base[FF_PATH_MAX];
  ff_jobj_path(no, "groups", base, sizeof base);
  int n = cJSON_GetArraySize(arr);
  c->groups = calloc((size_t)n ? (size_t)n : 1, sizeof *c->groups);
  if (!c->groups)
    return false;
  bool ok = true;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    char p[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s[%d]", base, i);
    ff_net_group *g = &c->groups[i];
    c->n_groups = i + 1;
    ff_jobj o;
    if (!ff_jobj_open(&o, d, e, p)) {
      ok = false;
      continue;
    }
    ok &= ff_jobj_name(&o, "name", true, g->name);
    const cJSON *nodes = ff_jobj_array(&o, "nodes", true, 1, CLUSTER_MAX_NODES);
    if (nodes) {
      g->nodes = malloc((size_t)cJSON_GetArraySize(nodes) * sizeof *g->nodes);
      if (!g->nodes)
        return false;
      int k = 0;
      for (const cJSON *ne = nodes->child; ne; ne = ne->next, k++) {
        char q[FF_PATH_MAX];
        snprintf(q, sizeof q, "%s.nodes[%d]", p, k);
        int node = resolve_node(d, c, ne, q);
        g->nodes[k] = node;
        g->n_nodes = k + 1;
        if (node < 0) {
          ok = false;
        } else if (c->nodes[node].group >= 0) {
          if (c->nodes[node].group == i)
            ff_diag_error(d, q, "node \"%s\" is listed twice in this group", c->nodes[node].name);
          else
            ff_diag_error(d, q, "node \"%s\" is already in group \"%s\" (a node belongs to at "
                          "most one group)", c->nodes[node].name, c->groups[c->nodes[node].group].name);
          ok = false;
        } else {
          c->nodes[node].group = i;
        }
      }
    } else {
      ok = false;
    }
    ok &= read_link(&o, &g->link, true, "bandwidth_gb_per_s", "latency_us");
    ff_jobj_close(&o);
  }
  return ok && unique_group_names(d, c, base);
}

static bool read_overrides(ff_jobj *no, ff_diag *d, ff_cluster *c) {
  const cJSON *arr = ff_jobj_array(no, "overrides", false, 0, CLUSTER_MAX_NODES);
  if (!arr)
    return !ff_jobj_get(no, "overrides", false);
  char base[FF_PATH_MAX];
  ff_jobj_path(no, "overrides", base, sizeof base);
  int n = cJSON_GetArraySize(arr);
  c->overrides = calloc((size_t)n ? (size_t)n : 1, sizeof *c->overrides);
  if (!c->overrides)
    return false;
  bool ok = true;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    char p[FF_PATH_MAX], q[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s[%d]", base, i);
    ff_net_override *ov = &c->overrides[i];
    ov->node_a = ov->node_b = -1;
    c->n_overrides = i + 1;
    ff_jobj o;
    if (!ff_jobj_open(&o, d, e, p)) {
      ok = false;
      continue;
    }
    const cJSON *pair = ff_jobj_get(&o, "nodes", true);
    snprintf(q, sizeof q, "%s.nodes", p);
    if (pair && (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2)) {
      ff_diag_error(d, q, "expected two node names");
      ok = false;
    } else if (pair) {
      char r[FF_PATH_MAX];
      snprintf(r, sizeof r, "%s[0]", q);
      ov->node_a = resolve_node(d, c, cJSON_GetArrayItem(pair, 0), r);
      snprintf(r, sizeof r, "%s[1]", q);
      ov->node_b = resolve_node(d, c, cJSON_GetArrayItem(pair, 1), r);
      if (ov->node_a < 0 || ov->node_b < 0) {
        ok = false;
      } else if (ov->node_a == ov->node_b) {
        ff_diag_error(d, q, "names the same node twice (an override joins two nodes)");
        ok = false;
      } else {
        for (int j = 0; j < i; j++) {
          const ff_net_override *x = &c->overrides[j];
          if ((x->node_a == ov->node_a && x->node_b == ov->node_b) ||
              (x->node_a == ov->node_b && x->node_b == ov->node_a)) {
            ff_diag_error(d, q, "this pair already has an override (%s[%d])", base, j);
            ok = false;
          }
        }
      }
    } else {
      ok = false;
    }
    ok &= read_link(&o, &ov->link, true, "bandwidth_gb_per_s", "latency_us");
    ff_jobj_close(&o);
  }
  return ok;
}

static bool read_network(ff_jobj *top, ff_diag *d, ff_cluster *c) {
  const cJSON *net = ff_jobj_get(top, "network", c->n_nodes > 1);
  if (!net)
    return c->n_nodes <= 1;
  ff_jobj no;
  char np[FF_PATH_MAX], dp[FF_PATH_MAX];
  ff_jobj_path(top, "network", np, sizeof np);
  if (!ff_jobj_open(&no, d, net, np))
    return false;
  c->has_network = true;
  bool ok = true;
  const cJSON *def = ff_jobj_get(&no, "default", true);
  if (def) {
    ff_jobj lo;
    ff_jobj_path(&no, "default", dp, sizeof dp);
    if (ff_jobj_open(&lo, d, def, dp)) {
      ok &= read_link(&lo, &c->net_default, true, "bandwidth_gb_per_s", "latency_us");
      ff_jobj_close(&lo);
    } else {
      ok = false;
    }
  } else {
    ok = false;
  }
  ok &= read_groups(&no, d, c);
  ok &= read_overrides(&no, d, c);
  ff_jobj_close(&no);
  return ok;
}

ff_status ff_cluster_from_json(const cJSON *v, const char *path, bool inline_ok,
                               const char *base_dir, ff_diag *d, ff_cluster *out) {
  memset(out, 0, sizeof *out);
  int errors_before = d->errors;
  ff_jobj o;
  if (!ff_jobj_open(&o, d, v, path))
    return FF_ERR_INPUT;
  bool ok = ff_format_key(&o, FF_FORMAT_CLUSTER, inline_ok);
  ok &= ff_jobj_name(&o, "name", true, out->name);
  if (ff_jobj_get(&o, "description", false))
    ok &= ff_jobj_text(&o, "description", false, 4096, &out->description);
  bool devices_ok = read_device_types(&o, base_dir, d, out);
  ok &= devices_ok;
  const cJSON *nodes = ff_jobj_array(&o, "nodes", true, 1, CLUSTER_MAX_NODES);
  char nodes_path[FF_PATH_MAX];
  ff_jobj_path(&o, "nodes", nodes_path, sizeof nodes_path);
  if (nodes && devices_ok) {
    out->nodes = calloc((size_t)cJSON_GetArraySize(nodes), sizeof *out->nodes);
    if (!out->nodes) {
      ff_cluster_free(out);
      return FF_ERR_RUNTIME;
    }
    bool nodes_ok = true;
    int i = 0;
    for (const cJSON *e = nodes->child; e; e = e->next, i++) {
      char p[FF_PATH_MAX];
      snprintf(p, sizeof p, "%s[%d]", nodes_path, i);
      nodes_ok &= read_node(d, e, p, out, &out->nodes[i]);
      out->total_gpus += out->nodes[i].gpus;
    }
    out->n_nodes = i;
    nodes_ok = index_nodes(d, out, nodes_path) && nodes_ok;
    /* Network references are checked only against well-formed nodes, so one bad node name
     * does not also show up as a dangling reference. */
    if (nodes_ok)
      ok &= read_network(&o, d, out);
    ok &= nodes_ok;
  } else {
    ok = false;
  }
  ff_jobj_get(&o, "network", false); /* a known key even when it was not read */
  ff_jobj_close(&o);
  if (!ok || d->errors > errors_before) {
    ff_cluster_free(out);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

static void add_link(cJSON *o, const char *bw_key, const char *lat_key, ff_link link) {
  cJSON_AddNumberToObject(o, bw_key, link.bandwidth_gb_per_s);
  cJSON_AddNumberToObject(o, lat_key, link.latency_us);
}

cJSON *ff_cluster_to_json(const ff_cluster *c, bool with_format, bool inline_devices) {
  cJSON *o = cJSON_CreateObject();
  if (with_format)
    cJSON_AddStringToObject(o, "format", ff_format_ids[FF_FORMAT_CLUSTER]);
  cJSON_AddStringToObject(o, "name", c->name);
  if (c->description)
    cJSON_AddStringToObject(o, "description", c->description);
  cJSON *devs = cJSON_AddArrayToObject(o, "device_types");
  for (int i = 0; i < c->n_devices; i++) {
    const ff_device *dev = &c->devices[i];
    if (dev->ref && !inline_devices)
      cJSON_AddItemToArray(devs, cJSON_CreateString(dev->ref));
    else
      cJSON_AddItemToArray(devs, ff_device_to_json(dev, false));
  }
  cJSON *nodes = cJSON_AddArrayToObject(o, "nodes");
  for (int i = 0; i < c->n_nodes; i++) {
    const ff_node *n = &c->nodes[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", n->name);
    cJSON_AddStringToObject(e, "device", c->devices[n->device].name);
    cJSON_AddNumberToObject(e, "gpus", n->gpus);
    cJSON_AddNumberToObject(e, "island_gpus", n->island_gpus);
    if (n->island_gpus > 1)
      add_link(e, "island_bandwidth_gb_per_s", "island_latency_us", n->island);
    if (n->island_gpus < n->gpus)
      add_link(e, "intra_bandwidth_gb_per_s", "intra_latency_us", n->intra);
    if (n->nics > 1) /* 1 is the default; 0 in a node built in memory means the same */
      cJSON_AddNumberToObject(e, "nics", n->nics);
    if (n->nic_bandwidth_gb_per_s > 0)
      cJSON_AddNumberToObject(e, "nic_bandwidth_gb_per_s", n->nic_bandwidth_gb_per_s);
    cJSON_AddItemToArray(nodes, e);
  }
  if (c->has_network) {
    cJSON *net = cJSON_AddObjectToObject(o, "network");
    cJSON *def = cJSON_AddObjectToObject(net, "default");
    add_link(def, "bandwidth_gb_per_s", "latency_us", c->net_default);
    cJSON *groups = cJSON_AddArrayToObject(net, "groups");
    for (int i = 0; i < c->n_groups; i++) {
      const ff_net_group *g = &c->groups[i];
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "name", g->name);
      cJSON *members = cJSON_AddArrayToObject(e, "nodes");
      for (int k = 0; k < g->n_nodes; k++)
        cJSON_AddItemToArray(members, cJSON_CreateString(c->nodes[g->nodes[k]].name));
      add_link(e, "bandwidth_gb_per_s", "latency_us", g->link);
      cJSON_AddItemToArray(groups, e);
    }
    cJSON *overrides = cJSON_AddArrayToObject(net, "overrides");
    for (int i = 0; i < c->n_overrides; i++) {
      const ff_net_override *ov = &c->overrides[i];
      cJSON *e = cJSON_CreateObject();
      cJSON *pair = cJSON_AddArrayToObject(e, "nodes");
      cJSON_AddItemToArray(pair, cJSON_CreateString(c->nodes[ov->node_a].name));
      cJSON_AddItemToArray(pair, cJSON_CreateString(c->nodes[ov->node_b].name));
      add_link(e, "bandwidth_gb_per_s", "latency_us", ov->link);
      cJSON_AddItemToArray(overrides, e);
    }
  }
  return o;
}

void ff_cluster_free(ff_cluster *c) {
  for (int i = 0; i < c->n_devices; i++)
    ff_device_free(&c->devices[i]);
  free(c->devices);
  free(c->description);
  free(c->nodes);
  free(c->node_by_name);
  for (int i = 0; i < c->n_groups; i++)
    free(c->groups[i].nodes);
  free(c->groups);
  free(c->overrides);
  memset(c, 0, sizeof *c);
}

ff_status ff_cluster_copy(const ff_cluster *src, ff_cluster *dst) {
  memset(dst, 0, sizeof *dst);
  *dst = *src;
  dst->description = NULL;
  dst->devices = NULL;
  dst->nodes = NULL;
  dst->node_by_name = NULL;
  dst->groups = NULL;
  dst->overrides = NULL;
  dst->n_devices = dst->n_groups = 0;
  size_t nn = (size_t)src->n_nodes;
  if ((src->description && !(dst->description = strdup(src->description))) ||
      !(dst->devices = calloc((size_t)src->n_devices, sizeof *dst->devices)) ||
      !(dst->nodes = malloc(nn * sizeof *dst->nodes)) ||
      !(dst->node_by_name = malloc(nn * sizeof *dst->node_by_name)) ||
      !(dst->groups = calloc((size_t)src->n_groups + 1, sizeof *dst->groups)) ||
      !(dst->overrides = malloc(((size_t)src->n_overrides + 1) * sizeof *dst->overrides)))
    goto fail;
  for (int i = 0; i < src->n_devices; i++, dst->n_devices++)
    if (ff_device_copy(&src->devices[i], &dst->devices[i]) != FF_OK)
      goto fail;
  memcpy(dst->nodes, src->nodes, nn * sizeof *dst->nodes);
  memcpy(dst->node_by_name, src->node_by_name, nn * sizeof *dst->node_by_name);
  if (src->n_overrides > 0)
    memcpy(dst->overrides, src->overrides, (size_t)src->n_overrides * sizeof *dst->overrides);
  for (int i = 0; i < src->n_groups; i++, dst->n_groups++) {
    dst->groups[i] = src->groups[i];
    dst->groups[i].nodes = malloc(((size_t)src->groups[i].n_nodes + 1) * sizeof(int));
    if (!dst->groups[i].nodes)
      goto fail;
    if (src->groups[i].n_nodes > 0)
      memcpy(dst->groups[i].nodes, src->groups[i].nodes, (size_t)src->groups[i].n_nodes * sizeof(int));
  }
  return FF_OK;
fail:
  ff_cluster_free(dst);
  return FF_ERR_RUNTIME;
}
