"""Integrations with other systems, each behind an extra: Ray (`ray_backend`, ``ray``) and
Flower (`flower`, ``flower``). They use the run floor; nothing below imports them (the local
backend names the Ray backend by its import path only)."""
