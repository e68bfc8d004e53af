"""What every stage of the data flow shares: the cluster, the plan, and the pipeline schedules.

- :mod:`~hybridplan.plan.cluster`: N nodes x k devices, their memory, speed and links (one device:
  :mod:`~hybridplan.plan.device_spec`);
- :mod:`~hybridplan.plan.stage`: one pipeline stage on ``data_degree x tensor_degree`` devices;
- :mod:`~hybridplan.plan.plan`: ONE plan type (the stages in order, schedule and batch) and its JSON form;
- :mod:`~hybridplan.plan.rules`: the rules a plan must follow (:meth:`Plan.validate`);
- :mod:`~hybridplan.plan.schedule`: the typed schedule registry and the action IR (``F3``, ``B0``).

Nothing here imports torch: plans are read, checked, predicted and searched without it.
"""

from hybridplan.plan.cluster import Cluster, DeviceSpec
from hybridplan.plan.plan import Plan
from hybridplan.plan.schedule import SCHEDULES, Schedule, ScheduleSpec, as_schedule, spec
from hybridplan.plan.stage import PARALLELISMS, Parallelism, StagePlan

__all__ = [
    "Cluster",
    "DeviceSpec",
    "PARALLELISMS",
    "Parallelism",
    "Plan",
    "StagePlan",
    "SCHEDULES",
    "Schedule",
    "ScheduleSpec",
    "as_schedule",
    "spec",
]
