"""Plans of training runs across GPUs: layouts, interconnects, each stage's costs, the step's time and memory.

    from jitflops.planning import Layout, Planner, best_layouts, plan_training
"""

from .interconnects import INTERCONNECTS, Interconnect, InterconnectError, interconnect
from .layout import Layout, LayoutError
from .plan import Planner, StepBreakdown, TrainingPlan, plan_training
from .search import SearchResult, best_layouts

__all__ = ["INTERCONNECTS", "Interconnect", "InterconnectError", "Layout", "LayoutError", "Planner", "SearchResult", "StepBreakdown", "TrainingPlan",
           "best_layouts", "interconnect", "plan_training"]
