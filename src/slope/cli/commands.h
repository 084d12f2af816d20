// One function per `slope` subcommand. Each parses its own flags (CLI11), returns the process
// exit code, and lets slope::Error propagate to main, which prints it and exits 1.
#pragma once

namespace slope::cli {

int cmd_run(int argc, char** argv);         // run.cpp: prefill of one prompt, any mesh
int cmd_make_model(int argc, char** argv);  // make_model.cpp: random-weight HF model
int cmd_kv_merge(int argc, char** argv);    // kv_merge.cpp: assemble per-rank KV shards
int cmd_plan(int argc, char** argv);        // plan.cpp: SLO planner
int cmd_calibrate(int argc, char** argv);   // calibrate.cpp: hardware profile of this machine
int cmd_tokenize(int argc, char** argv);    // tokenize.cpp: text to ids and back (tokenizer.json)
int cmd_serve(int argc, char** argv);       // serve.cpp: the HTTP prefill server (front)
int cmd_instance(int argc, char** argv);    // instance.cpp: one engine instance of serve (hidden)

}  // namespace slope::cli
