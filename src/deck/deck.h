// The input deck, LAMMPS style: one command per line, '#' comments, '&'
// continuation, `variable NAME VALUE` and ${NAME} substitution (a -var on the
// command line wins), `include FILE`. Rank 0 reads the deck (read_deck) and
// broadcasts the resolved lines; every rank then builds the same Program.
// Every error is an InputError "FILE:LINE: what is wrong (expected ...)".
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include "deck/config.h"

namespace xx {

// One resolved command: variables substituted, continuations joined.
struct DeckLine {
  std::string file;
  int line = 0;
  std::string text;                 // resolved text, for the echo
  std::vector<std::string> words;   // text split on whitespace
};

// `run N` with the configuration in force at that line.
struct Phase {
  Config config;
  int64_t steps = 0;
  std::string where;  // "FILE:LINE" of the run command
};

struct Program {
  std::vector<DeckLine> lines;
  std::vector<Phase> phases;
  std::string deck_text;  // the resolved deck, one command per line, stored in checkpoints
};

// Reads and resolves a deck file. `overrides` are the -var NAME VALUE pairs.
std::vector<DeckLine> read_deck(const std::string& path, const std::map<std::string, std::string>& overrides);

// Validates every command and builds the phases. With check_files, files the
// deck names (data) must exist. Throws InputError.
Program build_program(const std::vector<DeckLine>& lines, bool check_files);

// For the broadcast from rank 0.
std::string serialize(const std::vector<DeckLine>& lines);
std::vector<DeckLine> deserialize(const std::string& blob);

// Table of resolved parameters, one "name value" row each, for the echo.
std::string describe(const Config& config);

// Every phase's resolved configuration as JSON, for tools that need a deck's
// values without parsing decks themselves (xuanxue -print-config json):
// {"phases": [{"where": "FILE:LINE", "steps": N, "config": {COMMAND: {KEYWORD: VALUE, ...}, ...}}, ...]}
// A command with a kind word holds it under its kind label ("kind", "mode", ...);
// a command that is one value (seed S, timeout S) is that value.
std::string program_json(const Program& program);

// "FILE:LINE" of the first line that gives `command`, or "deck" when none
// does (for errors about a per-job setting found after the deck was built).
std::string where_given(const Program& program, const std::string& command);

// Names of all deck commands (for help and did-you-mean).
std::vector<std::string> command_names();

}  // namespace xx
