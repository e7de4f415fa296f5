"""From an analysed spec to loop nests.

``loops`` is the loop IR, the contract with every printer. ``lower`` is the pipeline, a sequence of stages over
frozen results: ``params`` (names and dtypes), ``guards`` (linear conditions, solved and narrowed), ``schedule``
(loop order, parallel loops, tiling), ``translate`` (spec expressions to loop-IR expressions), ``emit`` (the one
mutable builder: fresh names, size parameters, hoisting) and ``assemble`` (the loop nest)."""
