/* ffplan_cmds.h — the subcommands of ffplan, each taking the arguments after its name and
 * returning an exit status (0 ok, 1 runtime failure, 2 bad input or usage, 3 nothing fits). */
#ifndef FFPLAN_CMDS_H
#define FFPLAN_CMDS_H

#include "ff_cost.h"
#include "ff_format.h"

int ffplan_cmd_simulate(int argc, char **argv);
int ffplan_cmd_plan(int argc, char **argv);
int ffplan_cmd_show(int argc, char **argv);
int ffplan_cmd_check(int argc, char **argv);
int ffplan_cmd_diff(int argc, char **argv);
int ffplan_cmd_calibrate(int argc, char **argv);
int ffplan_cmd_metrics(int argc, char **argv);
/* Point a plan's ranks at another cluster's nodes and device types (by name); the plan's own
 * cluster is left as it was, the caller swaps it in. */
ff_status ffplan_rebind(ff_plan *p, const ff_cluster *c);
/* Read a plan (its errors printed to stderr) and evaluate it with the cost model; on failure
 * nothing is left to free. */
int ffplan_load_and_eval(const char *file, ff_plan *plan, ff_plan_eval *e);

#endif
