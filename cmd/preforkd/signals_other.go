//go:build !linux

package main

// releaseSignals does nothing: the supervisor runs on Linux only.
func releaseSignals() {}
