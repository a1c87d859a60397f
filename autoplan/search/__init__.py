"""Search: candidate generation, the CP-SAT solver and a brute-force reference."""
