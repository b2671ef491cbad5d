"""Plans of training runs across GPUs: layouts, interconnects, each stage's costs, the step's time and memory; serving with tensor parallelism.

    from jitflops.planning import Layout, Planner, best_layouts, plan_serving, plan_training
"""

from .interconnects import INTERCONNECTS, Interconnect, InterconnectError, interconnect
from .layout import Layout, LayoutError
from .plan import Planner, StepBreakdown, TrainingPlan, plan_training
from .search import SearchResult, best_layouts
from .serving import ServingPlan, plan_serving

__all__ = ["INTERCONNECTS", "Interconnect", "InterconnectError", "Layout", "LayoutError", "Planner", "SearchResult", "ServingPlan", "StepBreakdown",
           "TrainingPlan", "best_layouts", "interconnect", "plan_serving", "plan_training"]
