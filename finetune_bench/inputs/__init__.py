"""What the user asks for: the settings and the names they may use, the arm grammar, their validation,
and the grid of runs they expand to. Standard library only (Liger's kernel table is read when asked)."""
