"""The planner: which implementation (loop backend or an XLA form) runs each kernel of `auto`."""
