"""A stand-in for the skymap-scanner package in the local scanner image: only its server's entry point."""
