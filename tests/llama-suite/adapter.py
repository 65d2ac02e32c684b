#!/usr/bin/env python3
"""Stands in for llama-server's binary in llama.cpp's own server test suite
(`tools/server/tests`, run unedited with LLAMA_SERVER_BIN_PATH pointing here):
reads the llama-server flags a test starts the server with and starts the
server under test instead, on the default model, so that no test downloads one.

  SUITE_TARGET=llama-server  SUITE_LLAMA_SERVER=path  llama-server itself
  SUITE_TARGET=slotgate      SUITE_ENGINE=path        slotgate-engine, its flags translated
  SUITE_MODEL=path           the model either loads in place of the test's

Flags slotgate-engine has no counterpart for (GPU, batch shapes, web UI) are dropped; each test then shows what that costs."""

import os
import sys

# Flags that take a value, and those that do not, as the suite passes them.
VALUED = {"--port", "--host", "--temp", "--seed", "--model", "-m", "--model-url", "--model-draft",
          "--hf-repo", "--hf-file", "--models-dir", "--models-max", "--models-preset",
          "--cors-origins", "--batch-size", "--ubatch-size", "--threads", "--n-gpu-layers",
          "--pooling", "--alias", "--tags", "--ctx-size", "--parallel", "-ctk", "-ctv", "-fa",
          "--n-predict", "--slot-save-path", "--grp-attn-n", "--grp-attn-w", "--lora",
          "--spec-type", "--api-key", "--spec-draft-n-max", "--spec-draft-n-min",
          "--spec-synth-len", "--spec-synth-rates", "--reasoning-format", "--reasoning",
          "--chat-template", "--chat-template-file", "--mmproj-url", "--media-path",
          "--sleep-idle-seconds", "--cache-ram", "--tools", "--tools-runtime",
          "--mcp-servers-config", "--mcp-servers-json"}
MODEL_FLAGS = {"--model", "-m", "--model-url", "--hf-repo", "--hf-file"}


def parse(argv):
    """The flags as (name, value or None) pairs, in order."""
    flags, i = [], 0
    while i < len(argv):
        name = argv[i]
        if name in VALUED and i + 1 < len(argv):
            flags.append((name, argv[i + 1]))
            i += 2
        else:
            flags.append((name, None))
            i += 1
    return flags


def for_llama_server(flags, model):
    args = ["--model", model]
    for name, value in flags:
        if name not in MODEL_FLAGS and name != "--offline":
            args += [name] if value is None else [name, value]
    return args


def for_slotgate(flags, model):
    given = dict(flags)
    args = ["--model", model, "--host", given.get("--host", "127.0.0.1"),
            "--port", given.get("--port", "8080")]
    # llama-server answers any model name with its one model.
    args += ["--any-model-name", "true"]
    slots = int(given.get("--parallel", "1"))
    args += ["--n-parallel", str(slots)]
    if "--ctx-size" in given:
        # llama-server's context is shared by its slots; slotgate's is each slot's.
        args += ["--ctx-len", str(max(64, int(given["--ctx-size"]) // slots))]
    if "--alias" in given:
        args += ["--model-id", given["--alias"]]
    if "--batch-size" in given:
        args += ["--batch-size", given["--batch-size"]]
    if "--threads" in given:
        args += ["--threads", given["--threads"]]
    if "--embedding" in given:
        args += ["--embedding", "true"]
    if given.get("--pooling") in ("mean", "cls", "last", "none"):
        args += ["--pooling", given["--pooling"]]
    if "--reranking" in given or "--rerank" in given:
        args += ["--reranking", "true"]
    for name in ("--chat-template", "--chat-template-file"):
        if name in given:
            args += [name, given[name]]
    if given.get("--reasoning") == "off":
        args += ["--enable-thinking", "false"]
    if "--temp" in given:
        args += ["--temperature", given["--temp"]]
    if "--seed" in given:
        args += ["--seed", given["--seed"]]
    if "--n-predict" in given:
        args += ["--n-predict", given["--n-predict"]]
    if "--slot-save-path" in given:
        args += ["--slot-save-path", given["--slot-save-path"]]
    # llama-server allows every origin unless told which (this machine's pages
    # only once its tools are on); slotgate-engine none.
    args += ["--cors-origins", given.get("--cors-origins", "localhost" if "--tools" in given else "*")]
    # llama-server's /metrics needs --metrics; its /slots is on unless --no-slots.
    args += ["--metrics-endpoint", "true" if "--metrics" in given else "false"]
    if "--no-slots" in given:
        args += ["--slots-endpoint", "false"]
    if "--kv-unified" in given:
        args += ["--kv-unified", "true"]
    if "--sleep-idle-seconds" in given:
        args += ["--sleep-idle-s", given["--sleep-idle-seconds"]]
    if "--verbose" in given:
        args += ["--verbose", "true"]
    if "--api-key" in given:
        # Off the command line: the engine reads its keys from a variable.
        os.environ["SUITE_ENGINE_API_KEY"] = given["--api-key"]
        args += ["--api-key-env", "SUITE_ENGINE_API_KEY"]
    return args


def main() -> None:
    flags = parse(sys.argv[1:])
    model = os.environ["SUITE_MODEL"]
    if os.environ.get("SUITE_TARGET") == "llama-server":
        binary, args = os.environ["SUITE_LLAMA_SERVER"], for_llama_server(flags, model)
    else:
        binary, args = os.environ["SUITE_ENGINE"], for_slotgate(flags, model)
    sys.stdout.flush()
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
