"""Pipelines on the device against an app that does its own pre- and post-processing."""
