"""Talking to the Spooled API: the REST routes and their typed errors, and HTTP/1.1 connections."""
