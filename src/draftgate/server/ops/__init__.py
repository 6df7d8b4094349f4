"""Operating speculation safely: admin API, kill switch, canary with auto-rollback, shadow mode, lossless canary."""

from draftgate.server.ops.canary import Arm, CanaryConfig, CanaryMonitor, Sample
from draftgate.server.ops.state import Finished, Ops, OpsConfig, RouteOps

__all__ = ["Arm", "CanaryConfig", "CanaryMonitor", "Finished", "Ops", "OpsConfig", "RouteOps", "Sample"]
