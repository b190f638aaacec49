"""Pure domain of the coordinator: values, states, rollup math. No I/O; `now` is passed in."""
