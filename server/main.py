"""`lucebox serve`: command-line arguments -> `ServerConfig` -> engine -> uvicorn.

The core CLI (`lucebox.cli`) defines the arguments and imports this module only when the
``serve`` command runs, so ``import lucebox`` never imports the server or FastAPI.
"""
from __future__ import annotations

import argparse
import logging
import socket
import sys

from lucebox.cli import placement_kwargs
from lucebox.errors import ConfigError

from .config import ServerConfig

__all__ = ["config_from_args", "serve"]

log = logging.getLogger("lucebox.server")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server configuration for parsed ``lucebox serve`` arguments. Without --model, the
    default model (see `lucebox.default_model`) is prepared and used."""
    from lucebox.cli import model_of

    model = model_of(args)
    draft = args.draft
    names: tuple[str, ...] = ()
    model_name = args.model_name
    if model is None:
        from lucebox import default_model

        if draft is not None:
            from lucebox.errors import ConfigError

            raise ConfigError("--draft needs --model")
        target_path, draft_path = default_model.default_model_paths()
        # (--spec ngram proposes from the context: the demo target alone)
        model, draft = str(target_path), None if args.spec == "ngram" else str(draft_path)
        model_name = model_name or default_model.DEFAULT_MODEL_NAME
        names = (default_model.DEFAULT_MODEL_NAME,)
    cache_mb = args.prefix_cache_mb
    return ServerConfig(
        model=model, draft=draft, host=args.host, port=args.port, ctx=args.ctx, kv_type=args.kv_type,
        kv_type_k=args.kv_type_k, kv_type_v=args.kv_type_v,
        device=args.device, spec=args.spec, threads=args.threads, ubatch=args.ubatch, slots=args.slots,
        queue=args.queue, model_name=model_name, api_key=args.api_key, default_max_tokens=args.max_tokens,
        max_reasoning_tokens=args.max_reasoning_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, chat_template_file=args.chat_template_file,
        log_level=args.log_level, prefix_cache_mb=cache_mb,
        prefix_cache_location=args.prefix_cache_location, prefix_cache_interval=args.prefix_cache_interval,
        prefix_cache_dir=args.prefix_cache_dir, prefix_cache_disk_mb=args.prefix_cache_disk_mb,
        extra_model_names=names + tuple(getattr(args, "alias", None) or ()), **placement_kwargs(args))


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the model loads: a busy port or an address this
    machine does not have fails at once, not after minutes of loading. Port 0: one the system picks."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted. Returns the process exit code."""
    import uvicorn

    level = getattr(logging, args.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    config = config_from_args(args)
    from .app import create_app, load_engine

    sock = listen(config.host, config.port)
    log.info("loading %s%s", config.model, f" with draft {config.draft}" if config.draft else "")
    try:
        engine = load_engine(config)
    except BaseException:
        sock.close()
        raise
    app = create_app(config, engine)
    svc = app.state.service
    log.info("model %r on %s: context %d tokens, %d slot(s), queue %d, tool-call format %s, chat template %s",
             svc.model_name, engine.device, svc.n_ctx, config.slots, config.queue, svc.tool_format,
             config.chat_template_file or "from the GGUF (or lucebox's default)")
    if config.prefix_cache_mb > 0:
        log.info("prefix cache: %d MiB of %s memory for snapshots of long prompts", config.prefix_cache_mb,
                 config.prefix_cache_location)
    disk = svc.prefix_cache.disk if svc.prefix_cache is not None else None
    if disk is not None:
        log.info("prefix cache on disk: %s (at most %d MiB; %d snapshots there now)", disk.dir,
                 config.prefix_cache_disk_mb, disk.counters()["disk_entries"])
    port = sock.getsockname()[1]
    log.info("listening on http://%s:%d (OpenAI API under /v1)", config.host, port)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=port, log_level=args.log_level,
                                           access_log=args.access_log, timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if disk is not None:  # finish the snapshots still queued for disk
            disk.close()
    return 0 if server.started else 3  # (3: uvicorn's code for a server that did not start)
