/* cmd_review.h — ffplan subcommands that turn a plan into artefacts for people and launchers:
 * `svg` (a drawing of the plan and, optionally, its simulated schedule) and `hostfile` (what
 * places each rank on its node and GPU). Each takes the arguments after its name and returns an
 * exit status (0 ok, 1 runtime failure, 2 bad input or usage). */
#ifndef CMD_REVIEW_H
#define CMD_REVIEW_H

int ffplan_cmd_svg(int argc, char **argv);
int ffplan_cmd_hostfile(int argc, char **argv);

#endif
