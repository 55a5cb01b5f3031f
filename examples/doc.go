// Package examples holds the example configuration, examples/preforkd.toml,
// which `make run` uses, embedded so that the preforkd binary prints it
// (`preforkd example-config`): a user who has only the binary can start
// from it. Embedding the file from the package that owns it keeps one
// source of truth; a copy next to the command would drift.
//
// The embedding example is examples/embed, a program of its own.
package examples
