"""Cost models: pure functions of a plan and a problem; estimate() composes them."""
