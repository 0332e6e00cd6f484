"""``runner: ray``: the Ray runner (:mod:`.runner`) and its parts, one job each."""
