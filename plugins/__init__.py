"""Exporters: turn a plan into what a training framework launches."""
