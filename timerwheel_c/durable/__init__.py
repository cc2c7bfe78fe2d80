"""Durable timers: a store, a handler registry keyed by kind, a runner and a service."""
