package examples

import _ "embed"

// Config is examples/preforkd.toml: every key of the configuration file
// with its meaning and default, and two example rules.
//
//go:embed preforkd.toml
var Config string
