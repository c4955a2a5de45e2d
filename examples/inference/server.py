"""The inference service: HTTP in, decode and preprocess on a worker pool, micro-batches, H2D, model, D2H.

    python -m examples.inference.server --backend cpu --port 8000 [--knobs-file knobs.yaml] [--set pinned=false]
    python -m examples.inference.server --backend torch --gpu 0 --port 8000 --workload inference-a

Routes: ``POST /v1/image`` (a JPEG body; ``?model=vit`` (ViT-L/16, default) or ``?model=clip``: CLIP's
image tower), ``POST /v1/audio`` (a WAV body: Whisper-large-v3's encoder), ``POST /v1/text`` (JSON
``{"text": "..."}``: CLIP's text tower), ``GET /healthz``, ``GET /metrics`` (Prometheus text),
``GET``/``POST /admin/knobs`` (JSON knobs; ``?replace=1`` drops earlier admin overrides first).
README.md beside this file has the metrics, the knobs and the knobs-file contract.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from . import preprocess as pp
from .backends import MODELS, Backend, load_backend
from .batching import Done, MicroBatcher
from .knobs import KnobError, Knobs, KnobStore, merge, parse_assignment, validate
from .metrics import ServiceMetrics
from .netfault import NetFault
from .workers import Overloaded, WorkerPool

log = logging.getLogger("inference.server")
REPO = Path(__file__).resolve().parents[2]
ROUTES = {"image": ("vit", "clip_image"), "audio": ("whisper",), "text": ("clip_text",)}
MAX_BODY = 32 << 20


class NoisyNeighbour:
    """The hog process behind the ``noisy_neighbour`` knob (``neighbour.py``)."""

    def __init__(self, backend: str, service_gpu: int, gpu: str = "other") -> None:
        self.backend = backend
        self.service_gpu = service_gpu
        self.gpu = gpu
        self.mode = "off"
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def set(self, mode: str) -> None:
        with self._lock:
            if mode == self.mode and (mode == "off" or self.running):
                return
            self._stop_locked()
            self.mode = "off"
            if mode == "off":
                return
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            cmd = [sys.executable, "-m", "examples.inference.neighbour", "--backend", self.backend, "--mode", mode,
                   "--gpu", self.gpu, "--service-gpu", str(self.service_gpu)]
            try:
                self.proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL,
                                             stdout=sys.stderr.fileno())
                self.mode = mode
                self.last_error = None
            except OSError as e:
                self.last_error = f"cannot start the noisy neighbour: {e}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def _stop_locked(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()
            self.mode = "off"


class InferenceService:
    """Everything but HTTP: the pool, the batchers, the backend, the knobs and what applies them."""

    def __init__(self, backend: Backend, store: KnobStore, netfault: NetFault | None = None,
                 neighbour: NoisyNeighbour | None = None, deadline_s: float = 0.25, max_queue: int = 512,
                 request_timeout_s: float = 30.0, workload: str | None = None) -> None:
        self.backend = backend
        self.store = store
        self.netfault = netfault
        self.neighbour = neighbour
        self.deadline_s = deadline_s
        self.timeout_s = request_timeout_s
        self.workload = workload
        self.started = time.time()
        self.warnings: list[str] = []
        self.inflight = 0
        self._inflight_lock = threading.Lock()
        k = store.knobs
        self.pool = WorkerPool(k.workers, k.cpu_affinity, max_queue=max_queue)
        self.metrics = ServiceMetrics(self)
        self.batchers = {m: MicroBatcher(m, self._batch_runner(m), self._limits, max_queue=max_queue)
                         for m in self._models()}
        store.subscribe(self._on_knobs)
        self._apply_side_effects(Knobs(), k)
        store.start()

    def _models(self) -> list[str]:
        names = self.backend.info().get("models", "")
        return [m for m in names.split(",") if m in MODELS] or list(MODELS)

    def _limits(self) -> tuple[int, float]:
        k = self.store.knobs
        return k.batch_size, k.max_wait_ms / 1000.0

    # -- knobs ----------------------------------------------------------------------------------
    def _on_knobs(self, old: Knobs, new: Knobs) -> None:
        self._apply_side_effects(old, new)

    def _apply_side_effects(self, old: Knobs, new: Knobs) -> None:
        warnings: list[str] = []
        self.pool.resize(new.workers)
        self.pool.set_affinity(new.cpu_affinity)
        if self.netfault is None:
            if new.net_drop > 0:
                warnings.append("net_drop: the network fault is switched off for this service (--net-tool off)")
        elif new.net_drop != old.net_drop or self.netfault.applied != new.net_drop:
            ok = self.netfault.apply(new.net_drop)
            if not ok and new.net_drop > 0:
                warnings.append(f"net_drop: not applied: {self.netfault.reason()}")
        if self.neighbour is not None:
            self.neighbour.set(new.noisy_neighbour)
            if self.neighbour.last_error:
                warnings.append(f"noisy_neighbour: {self.neighbour.last_error}")
        elif new.noisy_neighbour != "off":
            warnings.append("noisy_neighbour: switched off for this service")
        self.warnings = warnings
        for w in warnings:
            log.warning(w)

    def knob_report(self) -> dict[str, Any]:
        st = self.store.state()
        applied: dict[str, Any] = {}
        if self.netfault is not None:
            applied["net_drop"] = self.netfault.applied
        applied["noisy_neighbour"] = self.neighbour.mode if self.neighbour is not None else "off"
        applied["workers"] = self.pool.size()
        return {"knobs": st.knobs.as_dict(), "generation": st.generation, "source": st.source,
                "applied_at": st.applied_at, "overrides": st.overrides, "file": st.file_path,
                "file_sha256": st.file_sha256, "file_error": st.file_error, "applied": applied,
                "warnings": list(self.warnings)}

    # -- the request path -------------------------------------------------------------------------
    def _batch_runner(self, model: str):  # type: ignore[no-untyped-def]
        def run(items: list[np.ndarray]) -> list[tuple[np.ndarray, dict[str, float]]]:
            res = self.backend.run_batch(model, items)
            self.metrics.observe_batch(model, len(items), res)
            t = {"h2d": res.h2d_s, "model": res.model_s, "d2h": res.d2h_s}
            return [(o, t) for o in res.outputs]
        return run

    @staticmethod
    def _prepare(route: str, model: str, body: bytes) -> tuple[np.ndarray, float, float, dict[str, Any]]:
        t0 = time.perf_counter()
        meta: dict[str, Any] = {}
        if route == "image":
            img = pp.decode_jpeg(body)
            t1 = time.perf_counter()
            meta["size"] = list(img.size)
            arr = pp.resize_crop_normalise(img, pp.IMAGE_RECIPES[model])
        elif route == "audio":
            x, rate = pp.decode_wav(body)
            t1 = time.perf_counter()
            x = pp.resample_linear(x, rate)
            meta["seconds"] = round(len(x) / pp.SAMPLE_RATE, 3)
            arr = pp.log_mel_spectrogram(x)
        else:
            try:
                doc = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise pp.BadPayload(f"expected JSON {{\"text\": \"...\"}}: {e}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise pp.BadPayload('expected JSON {"text": "..."}')
            t1 = time.perf_counter()
            arr = pp.tokenize(doc["text"])
            meta["tokens"] = int(np.count_nonzero(arr != pp.EOS_ID)) + 1
        return arr, t1 - t0, time.perf_counter() - t1, meta

    def infer(self, route: str, model: str, body: bytes) -> tuple[int, dict[str, Any]]:
        t0 = time.perf_counter()
        with self._inflight_lock:
            self.inflight += 1
        status, reason = "ok", ""
        try:
            arr, dec_s, pre_s, meta = self.pool.submit(self._prepare, route, model, body).result(self.timeout_s)
            self.metrics.observe_stage("decode", model, dec_s)
            self.metrics.observe_stage("preprocess", model, pre_s)
            done: Done = self.batchers[model].submit(arr).result(self.timeout_s)
            self.metrics.observe_stage("queue", model, done.queue_s)
            vec, bt = done.output
            code, out = 200, self._answer(model, vec, meta, done, dec_s, pre_s, bt)
        except pp.BadPayload as e:
            code, status, reason, out = 400, "bad_request", "bad_request", {"error": str(e)}
        except Overloaded as e:
            code, status, reason, out = 503, "overloaded", "overloaded", {"error": str(e)}
        except FutureTimeout:
            code, status, reason, out = 504, "timeout", "timeout", {"error": f"no answer within {self.timeout_s:g} s"}
        except Exception as e:  # the model or a copy failed: the request fails, the service keeps serving
            log.exception("request failed")
            code, status, reason = 500, "error", "internal"
            out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        finally:
            with self._inflight_lock:
                self.inflight -= 1
        dt = time.perf_counter() - t0
        if code == 200 and dt > self.deadline_s:
            status = "deadline_exceeded"
        self.metrics.observe_request(route, status, reason, dt)
        if code == 200:
            out["latency_ms"] = round(dt * 1000, 3)
            out["status"] = status
        return code, out

    @staticmethod
    def _answer(model: str, vec: np.ndarray, meta: dict[str, Any], done: Done, dec_s: float, pre_s: float,
                bt: dict[str, float]) -> dict[str, Any]:
        v = np.asarray(vec, dtype=np.float32)
        out: dict[str, Any] = {"model": model, "output_dim": int(v.shape[0]), "batch_size": done.batch.size,
                               **meta}
        if model == "vit":
            top = np.argsort(v)[::-1][:5]
            out["top5"] = [[int(i), round(float(v[i]), 4)] for i in top]
        else:
            out["embedding_head"] = [round(float(x), 5) for x in v[:4]]
            out["embedding_norm"] = round(float(np.linalg.norm(v)), 5)
        out["timings_ms"] = {"decode": dec_s * 1e3, "preprocess": pre_s * 1e3, "queue": done.queue_s * 1e3,
                             **{k: s * 1e3 for k, s in bt.items()}}
        out["timings_ms"] = {k: round(x, 3) for k, x in out["timings_ms"].items()}
        return out

    def close(self) -> None:
        self.store.close()
        for b in self.batchers.values():
            b.close()
        self.pool.close()
        if self.netfault is not None:
            self.netfault.close()
        if self.neighbour is not None:
            self.neighbour.stop()
        self.backend.close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "triscope-inference/1"
    service: InferenceService
    admin_token: str | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, (json.dumps(obj) + "\n").encode())

    def _body(self) -> bytes | None:
        n = self.headers.get("Content-Length")
        if n is None:
            self._json(411, {"error": "Content-Length required"})
            return None
        try:
            size = int(n)
        except ValueError:
            self._json(400, {"error": f"bad Content-Length {n!r}"})
            return None
        if size > MAX_BODY:
            self.close_connection = True
            self._json(413, {"error": f"body too large: {size} bytes (at most {MAX_BODY})"})
            return None
        return self.rfile.read(size) if size > 0 else b""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = urlsplit(self.path).path
        svc = self.service
        if path == "/metrics":
            body, ctype = svc.metrics.render()
            self._send(200, body, ctype)
        elif path == "/healthz":
            self._json(200, {"status": "ok", "backend": svc.backend.info(), "workload": svc.workload,
                             "models": list(svc.batchers), "uptime_s": round(time.time() - svc.started, 3),
                             "knobs": svc.store.knobs.as_dict()})
        elif path == "/admin/knobs":
            if self._authorised():
                self._json(200, svc.knob_report())
        else:
            self._json(404, {"error": f"no route GET {path}"})

    def _authorised(self) -> bool:
        if not self.admin_token:
            return True
        if self.headers.get("Authorization", "") == f"Bearer {self.admin_token}":
            return True
        self._json(401, {"error": "admin endpoint: missing or wrong bearer token"})
        return False

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        body = self._body()
        if body is None:
            return
        svc = self.service
        if parts.path == "/admin/knobs":
            if not self._authorised():
                return
            try:
                doc = json.loads(body.decode("utf-8")) if body.strip() else {}
            except (UnicodeDecodeError, ValueError) as e:
                self._json(400, {"error": f"admin knobs: body is not JSON: {e}"})
                return
            replace = query.get("replace", ["0"])[0].lower() in ("1", "true", "yes")
            try:
                svc.store.set_overrides(doc, replace=replace)
            except KnobError as e:
                self._json(400, {"error": str(e)})
                return
            self._json(200, svc.knob_report())
            return
        route = parts.path.removeprefix("/v1/")
        if not parts.path.startswith("/v1/") or route not in ROUTES:
            self._json(404, {"error": f"no route POST {parts.path}"})
            return
        model = ROUTES[route][0]
        if route == "image":
            want = query.get("model", ["vit"])[0]
            model = {"vit": "vit", "clip": "clip_image", "clip_image": "clip_image"}.get(want, "")
            if not model:
                self._json(400, {"error": f"model: vit or clip, got {want!r}"})
                svc.metrics.observe_request(route, "bad_request", "bad_request", 0.0)
                return
        if model not in svc.batchers:
            self._json(404, {"error": f"model {model} is not loaded in this service"})
            return
        code, out = svc.infer(route, model, body)
        self._json(code, out)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024   # a burst of connects must not overflow the listen backlog

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is no server error; anything else is logged on one line."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, TimeoutError)):
            return
        log.error("request from %s failed: %s: %s", client_address, type(exc).__name__, exc)


class InferenceServer:
    """The HTTP server: binds first (so the service knows its port), serves once a service is attached.

    ``start()`` serves on a thread (tests, the scenario runner), ``serve_forever()`` blocks."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, admin_token: str | None = None,
                 service: InferenceService | None = None) -> None:
        self._handler = type("BoundHandler", (Handler,), {"admin_token": admin_token})
        self.httpd = _HTTPServer((host, port), self._handler)
        self.host = host
        self.port = int(self.httpd.server_address[1])
        self.service: InferenceService | None = None
        self._thread: threading.Thread | None = None
        if service is not None:
            self.attach(service)

    def attach(self, service: InferenceService) -> InferenceServer:
        self.service = service
        self._handler.service = service
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> InferenceServer:
        if self.service is None:
            raise RuntimeError("attach a service before serving")
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        if self.service is None:
            raise RuntimeError("attach a service before serving")
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.service is not None:
            self.service.close()


def build_service(backend: str = "cpu", knobs_file: Path | None = None, settings: list[str] | None = None,
                  workload: str | None = None, port: int = 0, net_tool: str = "auto", net_dev: str = "lo",
                  neighbour: bool = True, neighbour_gpu: str = "other", deadline_ms: float = 250.0,
                  max_queue: int = 512, poll_s: float = 0.5, **backend_kw: Any) -> InferenceService:
    """Assemble a service (start-up knobs from ``settings`` ``KEY=VALUE``); the caller binds the port first
    when ``net_drop`` must know it (``port``)."""
    startup: dict[str, Any] = {}
    for s in settings or []:
        k, v = parse_assignment(s)
        startup.update(validate({k: v}))
    store = KnobStore(merge(Knobs(), startup), file=knobs_file, workload=workload, poll_s=poll_s)
    be = load_backend(backend, lambda: store.knobs, **backend_kw)
    nf = None if net_tool == "off" else NetFault(port, dev=net_dev, prefer=None if net_tool == "auto" else net_tool)
    nb = NoisyNeighbour(backend, int(backend_kw.get("gpu", 0)), neighbour_gpu) if neighbour else None
    return InferenceService(be, store, netfault=nf, neighbour=nb, deadline_s=deadline_ms / 1000.0,
                            max_queue=max_queue, workload=workload)


def _set_process_name(name: str) -> None:
    """Name the process after its workload (``/proc/PID/comm``, 15 bytes), as a service started as
    its own binary or by ``setproctitle`` is: off Kubernetes and systemd, triscope's attribution
    names a workload by this (``cmd:<comm>``), and a bare ``python3`` would not tell two instances
    apart.  Linux only; elsewhere nothing happens."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)     # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--backend", choices=("cpu", "torch"), default="cpu")
    ap.add_argument("--gpu", type=int, default=0, help="torch: the GPU this instance runs on")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--knobs-file", type=Path, default=None, help="the knobs file to watch (README.md: the contract)")
    ap.add_argument("--workload", default=None, help="this instance's workload name (checked against the file)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a start-up knob value")
    ap.add_argument("--deadline-ms", type=float, default=250.0, help="slower answers count as deadline_exceeded")
    ap.add_argument("--max-queue", type=int, default=512, help="waiting requests per queue before 503")
    ap.add_argument("--net-tool", choices=("auto", "nft", "iptables", "tc-netem", "off"), default="auto")
    ap.add_argument("--net-dev", default="lo", help="the device tc netem uses (nft/iptables need none)")
    ap.add_argument("--neighbour-gpu", default="other", help="GPU of the noisy neighbour: an index or 'other'")
    ap.add_argument("--cpu-model-scale", type=float, default=1.0, help="cpu backend: scale its model cost")
    ap.add_argument("--admin-token-file", type=Path, default=None, help="require this bearer token on /admin")
    args = ap.parse_args(argv)
    if args.workload:
        _set_process_name(args.workload)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = args.admin_token_file.read_text().strip() if args.admin_token_file else None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        print("server: --admin-token-file is required when binding beyond loopback", file=sys.stderr)
        return 2
    try:
        srv = InferenceServer(args.host, args.port, admin_token=token)
    except OSError as e:
        print(f"server: cannot listen on {args.host}:{args.port}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        svc = build_service(args.backend, args.knobs_file, args.set, args.workload, port=srv.port,
                            net_tool=args.net_tool, net_dev=args.net_dev, neighbour_gpu=args.neighbour_gpu,
                            deadline_ms=args.deadline_ms, max_queue=args.max_queue, gpu=args.gpu, dtype=args.dtype,
                            models=[m for m in args.models.split(",") if m], model_scale=args.cpu_model_scale)
    except (KnobError, ValueError, RuntimeError) as e:
        srv.httpd.server_close()
        print(f"server: {e}", file=sys.stderr)
        return 2
    srv.attach(svc)

    def _stop(signum: int, frame: object) -> None:
        threading.Thread(target=srv.httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(json.dumps({"event": "ready", "url": srv.url, "pid": os.getpid(), "backend": svc.backend.info(),
                      "workload": args.workload, "knobs": svc.store.knobs.as_dict(),
                      "blas_threads": {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
                      "net_fault": {"method": svc.netfault.method if svc.netfault else "off",
                                    "available": bool(svc.netfault and svc.netfault.available),
                                    "reason": svc.netfault.reason() if svc.netfault else "switched off"}}),
          flush=True)
    try:
        srv.serve_forever()
    finally:
        srv.httpd.server_close()
        svc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
