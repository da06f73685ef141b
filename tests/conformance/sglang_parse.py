"""Run inside the SGLang venv: feed command lines through SGLang's own parser and report the result.

stdin: JSON list of {"argv": [...], "files": {"/cfg/name": "content"}}; stdout: JSON list of results (with --serve:
one list per line, one report per line).
Each result says whether SGLang accepted the argv, which flags were not spelled exactly (argparse
would accept an abbreviation), which explicitly given values SGLang's HiCache resolution rewrote,
the parsed arguments, and what the storage extra-config becomes (SGLang's own extra-config parser,
and for NIXL what the plugin receives).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import logging
import os
import pathlib
import sys
import tempfile

logging.disable(logging.WARNING)

from sglang.srt.arg_groups import hicache_hook  # noqa: E402
from sglang.srt.arg_groups.overrides import declare_resolution  # noqa: E402
from sglang.srt.server_args import ServerArgs, prepare_server_args  # noqa: E402


def _real_extra_config_parser():
    """SGLang's parse_storage_backend_extra_config, taken from its source file and run alone.

    Its module imports CUDA-only kernels, so it cannot be imported here; the function itself is
    pure Python (json/tomllib/yaml), so its own text is compiled and executed in isolation.
    """
    import sglang

    path = pathlib.Path(sglang.__file__).parent / "srt/mem_cache/hybrid_cache/hybrid_cache_controller.py"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "parse_storage_backend_extra_config":
            node.decorator_list = []
            header = ast.parse("import json, os\nfrom typing import Optional").body
            module = ast.Module(body=header + [node], type_ignores=[])
            namespace: dict = {}
            exec(compile(ast.fix_missing_locations(module), str(path), "exec"), namespace)
            return namespace[node.name]
    raise RuntimeError(f"parse_storage_backend_extra_config not found in {path}")


PARSE_EXTRA_CONFIG = _real_extra_config_parser()
BASE_ENV = dict(os.environ)
PARSER = argparse.ArgumentParser()
ServerArgs.add_cli_args(PARSER)
ACTIONS = PARSER._option_string_actions


def _flags_and_dests(argv):
    inexact, given = [], set()
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            flag, has_value = token.split("=", 1)[0], "=" in token
            action = ACTIONS.get(flag)
            if action is None:
                inexact.append(flag)
            else:
                given.add(action.dest)
                if action.nargs != 0 and not has_value:
                    i += 1
        i += 1
    return inexact, given


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def _nixl_view(config):
    from sglang.srt.mem_cache.storage.nixl.nixl_utils import NixlBackendConfig

    nixl = NixlBackendConfig(config)
    plugin = nixl.get_specified_plugin()
    return {"plugin": plugin, "use_direct_io": nixl.get_use_direct_io(), "l3_cleaner": nixl.get_l3_cleaner_config(),
            "initparams": nixl.get_backend_initparams(plugin if plugin != "auto" else "POSIX")}


def check(request, workdir):
    argv = list(request["argv"])
    result = {"ok": False}
    result["inexact_flags"], given = _flags_and_dests(argv)
    for path, content in request.get("files", {}).items():
        local = pathlib.Path(workdir) / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content)
        # where start.sh names it: @path (the extra config) or the path itself (--config)
        argv = [str(local) if a == path else a.replace("@" + path, "@" + str(local)) for a in argv]
    os.environ.clear()
    os.environ.update(BASE_ENV, **request.get("env", {}))
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            sa = prepare_server_args(argv)
    except SystemExit as exc:
        result["error"] = f"argparse exit {exc.code}: {captured.getvalue().strip()[-400:]}"
        return result
    except Exception as exc:  # SGLang's own validation
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    # What `sglang serve` resolves later on a GPU host, for the fields the argv left unset.
    assumed = {}
    if sa.served_model_name is None:
        assumed["served_model_name"] = sa.model_path
    if sa.page_size is None:
        assumed["page_size"] = 1
    if sa.chunked_prefill_size is None:
        assumed["chunked_prefill_size"] = -1  # sized from GPU memory at start; not checkable here
    if assumed:
        declare_resolution(sa, "conformance: GPU-time defaults", **assumed)
    result["assumed"] = assumed
    try:
        hicache_hook.handle_hicache_ratio_default(sa)
        hicache_hook.handle_hicache(sa)
        sa.check_server_args()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    rewrites = {}
    for source, fields in getattr(sa, "_resolved_overrides", None) or []:
        for field, value in fields.items():
            if field in given and value != getattr(sa, field) and not source.startswith("conformance:"):
                rewrites[field] = {"given": getattr(sa, field), "resolved": value, "by": source}
    result["rewrites"] = rewrites
    result["args"] = {k: _jsonable(getattr(sa, k)) for k in type(sa).__struct_fields__}
    raw = sa.hicache_storage_backend_extra_config
    if raw:
        try:
            config, threshold, base, per_ki, prefix_keys = PARSE_EXTRA_CONFIG(raw)
        except Exception as exc:
            result["error"] = f"extra-config: {type(exc).__name__}: {exc}"
            return result
        result["extra_config"] = {"backend": config, "prefetch_threshold": threshold, "prefetch_timeout_base": base,
                                  "prefetch_timeout_per_ki_token": per_ki, "pass_prefix_keys": prefix_keys}
        if sa.hicache_storage_backend == "nixl":
            result["nixl"] = _nixl_view(config)
    result["ok"] = not result["inexact_flags"] and not rewrites
    return result


def main():
    """One JSON list of requests on stdin, one report on stdout; with --serve, one list per line and one report per
    line, for as long as stdin is open (the test session keeps one such process per SGLang version: importing SGLang
    costs far more than parsing). Each request starts from the same environment (check), so the answers are the same."""
    import sglang

    out = sys.stdout
    batches = sys.stdin if "--serve" in sys.argv[1:] else [sys.stdin.read()]
    for batch in batches:
        if not batch.strip():
            continue
        requests = json.loads(batch)
        with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(sys.stderr):  # stdout carries reports only
            results = [check(r, workdir) for r in requests]
        out.write(json.dumps({"sglang_version": sglang.__version__, "results": results}) + "\n")
        out.flush()


if __name__ == "__main__":
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    main()
