/* Subcommands of the kittykv CLI. Each returns the process exit status:
 * 0 success, 1 runtime failure, 2 usage error. Only the CLI prints. */
#ifndef KKV_CLI_CMD_H
#define KKV_CLI_CMD_H

int cmd_quantize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_passkey(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
