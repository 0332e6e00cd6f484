"""``diffrl plan``: the memory, FLOPs and time of a recipe on a real model's size, from its config alone (meta tensors); it analyses a recipe, it does not train."""
