// GPT-2's byte-level alphabet: every byte is shown as one printable code point so that BPE
// vocabularies hold only printable strings ("Ġ" is the space byte, "Ċ" the newline byte).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace dflash::tokenizer::byte_level {

// The code point that stands for byte b.
char32_t ByteToChar(unsigned char b);

// The UTF-8 encoding of ByteToChar(b), precomputed.
const std::array<std::string, 256>& ByteStrings();

// The bytes a byte-level string stands for, or nullopt when some code point is not in the
// alphabet (such a token cannot come out of BPE over bytes). `s` must be valid UTF-8.
std::optional<std::string> ToBytes(std::string_view s);

// The byte-level string for raw bytes.
std::string FromBytes(std::string_view bytes);

}  // namespace dflash::tokenizer::byte_level
