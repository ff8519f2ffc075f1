package main

import "flag"

// parseCommand parses a subcommand's flags wherever they stand among its
// positional arguments and returns exactly want positionals, or a usage
// error. Go's flag package stops at the first positional, so without this
// "gendata --items 10 DIR" would write 2000 items into a directory named
// "--items" and ignore the rest. "--" ends the flags.
func parseCommand(fs *flag.FlagSet, args []string, want int, usage string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	if len(pos) != want {
		return nil, usageError{usage}
	}
	return pos, nil
}
