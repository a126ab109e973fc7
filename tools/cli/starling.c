/* starling.c: entry point of the `starling` command. One binary with
 * subcommands, like `serf agent` / `serf members`: this file only
 * dispatches; each subcommand lives in its own tools/cli/cli_*.c. */
#include "tools/cli/cli.h"

#ifndef ST_VERSION
#define ST_VERSION "unknown"
#endif

static const st__subcommand_t commands[] = {
    {"node", st__cmd_node,
     "run a node: join a cluster, train, average with peers"},
    {"status", st__cmd_status, "show this node: step, loss, exchanges, ..."},
    {"peers", st__cmd_peers, "show every member this node knows"},
    {"top", st__cmd_top,
     "a live view of the cluster: one row per member, refreshed each second"},
    {"monitor", st__cmd_monitor,
     "stream the node's events: members, exchanges, rings, refusals"},
    {"join", st__cmd_join,
     "ask the node to join a cluster through seed addresses"},
    {"keys", st__cmd_keys,
     "list, install, use or remove the node's cluster keys (live rotation)"},
    {"force-leave", st__cmd_force_leave,
     "make the node forget a member that failed and will not come back"},
    {"leave", st__cmd_leave, "tell the node to leave the cluster and stop"},
    {"train", st__cmd_train,
     "train a model on this machine (local SGD, CPU or GPU)"},
    {"eval", st__cmd_eval,
     "score a checkpoint's model on a dataset: accuracy and loss"},
    {"predict", st__cmd_predict,
     "write a checkpoint's predictions for each row of a file (CSV, JSON)"},
    {"keygen", st__cmd_keygen,
     "make a node identity or cluster key file; show its public part"},
    {"kmeans", st__cmd_kmeans,
     "k-means over the cluster, each member on its own shard of the points"},
    {"lstsq", st__cmd_lstsq,
     "least squares over the cluster, each member on its own shard of the "
     "rows"},
    {"plot", st__cmd_plot,
     "draw loss and test accuracy per node from node logs (PNG, SVG)"},
};

static const st__program_t starling = {
    .prog = "starling",
    .intro =
        "usage: starling <command> [options]\n"
        "\n"
        "starling trains one model across peer machines with local SGD "
        "and\n"
        "gossip averaging. Commands:\n\n",
    .outro =
        "\n"
        "Run 'starling <command> --help' for the options of a command.\n",
    .noun = "command",
    .version = ST_VERSION,
    .commands = commands,
    .n_commands = sizeof(commands) / sizeof(commands[0]),
};

int main(int argc, char** argv) {
  return st__program_main(&starling, argc, argv);
}
