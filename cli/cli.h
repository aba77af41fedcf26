/* cli/cli.h — what the `ferry` subcommands share: their entry points and a
 * JSON writer of format/json_writer.h.
 */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include "format/json_writer.h"

#include <stdint.h>
#include <stdio.h>

int cli_info(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_plan(int argc, char **argv); /* cli/plan.c */
int cli_checkpoint(int argc, char **argv); /* cli/checkpoint.c */

#endif
