// Package textvalue is the text form of small configuration values: the
// names of an integer enum ([Enum]), and UnmarshalText over a Parse
// function ([Unmarshal]). It holds no state and is safe for concurrent use.
package textvalue
