"""A kubelet pod-resources server for tests: the real gRPC runtime (grpcio) serving
``v1.PodResourcesLister`` from the kubelet's ``.proto`` (``tests/proto/podresources_v1.proto``,
stubs generated with grpc_tools at import) on a unix socket, as the kubelet does.

``PodResourcesServer(path).start()``; ``set_pods([...])`` changes what ``List`` answers, e.g.
``{"namespace": "inference", "name": "vit-7f9c", "containers": [{"name": "server",
"devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-..."]}]}]}``.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

PROTO = Path(__file__).resolve().parent / "proto" / "podresources_v1.proto"
_lock = threading.Lock()
_modules: tuple[Any, Any] | None = None


def stubs() -> tuple[Any, Any]:
    """(messages module, grpc module) generated from the .proto, once per process."""
    global _modules
    with _lock:
        if _modules is None:
            from grpc_tools import protoc

            out = Path(tempfile.mkdtemp(prefix="podresources-stubs-"))
            rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}",
                              str(PROTO)])
            if rc != 0:
                raise RuntimeError(f"protoc failed on {PROTO} ({rc})")
            sys.path.insert(0, str(out))
            pb2 = importlib.import_module("podresources_v1_pb2")
            pb2_grpc = importlib.import_module("podresources_v1_pb2_grpc")
            _modules = (pb2, pb2_grpc)
        return _modules


class PodResourcesServer:
    def __init__(self, path: str | Path) -> None:
        import grpc

        pb2, pb2_grpc = stubs()
        self.path = str(path)
        self.pb2 = pb2
        self.pods: list[dict[str, Any]] = []
        self.calls = 0
        self.delay = 0.0
        self.abort: tuple[Any, str] | None = None     # (grpc.StatusCode, details): answer with that status
        self._built: bytes | None = None              # the answer for ``pods``, serialized once (a 4 MiB one takes
                                                      # 0.2 s to build, as long as the client takes to refuse it)
        server = self

        class Lister(pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc, name-defined]
            def List(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
                import time

                server.calls += 1
                if server.delay:
                    time.sleep(server.delay)
                if server.abort is not None:
                    context.abort(*server.abort)
                if server._built is None:
                    server._built = server._response().SerializeToString()
                return server._built

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        # the generated registration, with the answer's bytes kept between calls (the same bytes on the wire)
        self._grpc.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(Lister().List,
                                                        request_deserializer=pb2.ListPodResourcesRequest.FromString,
                                                        response_serializer=bytes)}),))
        self._grpc.add_insecure_port(f"unix:{self.path}")

    def _response(self) -> Any:
        pb2 = self.pb2
        pods = []
        for p in self.pods:
            containers = []
            for c in p.get("containers", []):
                devices = [pb2.ContainerDevices(resource_name=d["resource_name"], device_ids=d["device_ids"])
                           for d in c.get("devices", [])]
                dynamic = [pb2.DynamicResource(claim_name=d.get("claim_name", "claim"),
                                               claim_namespace=p["namespace"],
                                               claim_resources=[pb2.ClaimResource(driver_name=d["driver_name"],
                                                                                  pool_name=d.get("pool_name", "pool"),
                                                                                  device_name=d["device_name"])])
                           for d in c.get("dynamic", [])]
                containers.append(pb2.ContainerResources(name=c["name"], devices=devices, cpu_ids=c.get("cpu_ids", []),
                                                         dynamic_resources=dynamic))
            pods.append(pb2.PodResources(name=p["name"], namespace=p["namespace"], containers=containers))
        return pb2.ListPodResourcesResponse(pod_resources=pods)

    def set_pods(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self._built = None

    def start(self) -> PodResourcesServer:
        self._grpc.start()
        return self

    def stop(self) -> None:
        self._grpc.stop(grace=None).wait(5)
